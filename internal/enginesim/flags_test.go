package enginesim

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseFlagsDefaults(t *testing.T) {
	cfg, err := ParseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Model != DefaultModel || cfg.Host != "127.0.0.1" || cfg.Port != 8000 || cfg.MaxModelLen != 4096 ||
		cfg.Tokens != 16 || cfg.ChildLifetime != 10*time.Minute || !slices.Equal(cfg.ServedModelNames, []string{DefaultModel}) {
		t.Fatalf("defaults: %+v", cfg)
	}
}

func TestParseFlagsVLLMSyntax(t *testing.T) {
	cfg, err := ParseFlags([]string{
		"/models/llama", "--port", "8001", "--host=0.0.0.0",
		"--served-model-name", "llama", "llama-8b", "chat",
		"--max-model-len=8192", "--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.9",
		"--enable-prefix-caching", "--dtype", "bfloat16", "--shutdown-timeout=30", "--enable-sleep-mode",
		"--sim-load-delay", "1.5", "--sim-ttft=20ms", "--sim-itl", "5ms", "--sim-tokens", "7",
		"--sim-crash-after-tokens", "3", "--sim-exit-after-ready=2s", "--sim-ignore-sigterm",
		"--sim-spawn-child", "--sim-child-lifetime", "1m", "--sim-hang=false",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		Model: "/models/llama", Host: "0.0.0.0", Port: 8001,
		ServedModelNames: []string{"llama", "llama-8b", "chat"}, MaxModelLen: 8192,
		TensorParallelSize: 2, GPUMemoryUtilization: 0.9, EnablePrefixCaching: true, Dtype: "bfloat16",
		ShutdownTimeout: 30, EnableSleepMode: true, Runner: "auto", Convert: "auto",
		SleepResidueMiB: 512, IdleSleepLevel: 1, PortMessage: "old", SSENewline: "lf", WatchdogInterval: 5 * time.Second,
		LoadDelay: 1500 * time.Millisecond, TTFT: 20 * time.Millisecond, ITL: 5 * time.Millisecond, Tokens: 7,
		CrashAfterTokens: 3, ExitAfterReady: 2 * time.Second, IgnoreSigterm: true, SpawnChild: true,
		ChildLifetime: time.Minute,
	}
	if !equalConfig(cfg, want) {
		t.Fatalf("got  %+v\nwant %+v", cfg, want)
	}
}

func equalConfig(a, b Config) bool {
	a.reexecArgs, b.reexecArgs = nil, nil
	return reflect.DeepEqual(a, b)
}

// The model comes as --model, in both of argparse's spellings, in the
// command lines that poold gives a launcher (profile.Argv); a positional
// MODEL may repeat it, not contradict it.
func TestParseFlagsModelFlag(t *testing.T) {
	for _, model := range [][]string{{"--model", "org/m"}, {"--model=org/m"}, {"org/m", "--model", "org/m"}} {
		args := append(slices.Clone(model), "--host", "127.0.0.1", "--port", "9000", "--served-model-name", "id",
			"--tensor-parallel-size", "1", "--enable-sleep-mode")
		cfg, err := ParseFlags(args)
		if err != nil || cfg.Model != "org/m" || !slices.Equal(cfg.ServedModelNames, []string{"id"}) || cfg.Port != 9000 || !cfg.EnableSleepMode {
			t.Errorf("%q: err %v, model %q, names %q, port %d, sleep mode %v", args, err, cfg.Model, cfg.ServedModelNames, cfg.Port, cfg.EnableSleepMode)
		}
	}
	for _, args := range [][]string{{"org/a", "--model", "org/b"}, {"--model=org/b", "org/a"}} {
		if _, err := ParseFlags(args); err == nil || !strings.Contains(err.Error(), `model given twice: positional "org/a" and --model "org/b"`) {
			t.Errorf("%q: %v, want the model given twice", args, err)
		}
	}
	if _, err := ParseFlags([]string{"--model"}); err == nil || !strings.Contains(err.Error(), "argument --model: expected one argument") {
		t.Errorf("--model alone: %v", err)
	}
}

func TestParseFlagsVariants(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		check func(Config) bool
	}{
		{[]string{"--served-model-name=a", "--port", "1"}, func(c Config) bool {
			return slices.Equal(c.ServedModelNames, []string{"a"}) && c.Port == 1 && c.Model == DefaultModel
		}},
		{[]string{"--served-model-name", "a", "b"}, func(c Config) bool { return slices.Equal(c.ServedModelNames, []string{"a", "b"}) }},
		{[]string{"--port", "9", "m"}, func(c Config) bool { return c.Model == "m" && slices.Equal(c.ServedModelNames, []string{"m"}) }},
		{[]string{"--model", "m", "--max_model_len", "10"}, func(c Config) bool { return c.Model == "m" && c.MaxModelLen == 10 }},
		{[]string{"--enable-prefix-caching", "--no-enable-prefix-caching"}, func(c Config) bool { return !c.EnablePrefixCaching }},
		{[]string{"--sim-load-delay", "250ms"}, func(c Config) bool { return c.LoadDelay == 250*time.Millisecond }},
	} {
		cfg, err := ParseFlags(tc.args)
		if err != nil || !tc.check(cfg) {
			t.Errorf("%q: err %v, cfg %+v", tc.args, err, cfg)
		}
	}
}

func TestParseFlagsErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"m", "--bogus", "1"}, "unrecognized arguments: --bogus"},
		{[]string{"m", "n"}, "unrecognized arguments: n"},
		{[]string{"--port"}, "argument --port: expected one argument"},
		{[]string{"--port", "--host", "x"}, "argument --port: expected one argument"},
		{[]string{"--port", "x"}, "invalid int value"},
		{[]string{"--served-model-name"}, "expected at least one argument"},
		{[]string{"--served-model-name", "--port", "1"}, "expected at least one argument"},
		{[]string{"--sim-itl", "soon"}, "invalid duration"},
		{[]string{"-x"}, "unrecognized arguments: -x"},
	} {
		_, err := ParseFlags(tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want error containing %q", tc.args, err, tc.want)
		}
	}
	if _, err := ParseFlags([]string{"m", "--help"}); !errors.Is(err, ErrHelp) {
		t.Errorf("--help: %v", err)
	}
}
