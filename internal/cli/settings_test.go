package cli

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// testFlags are a daemon's flags, one of each kind.
func testFlags() *pflag.FlagSet {
	fl := NewFlagSet("d serve")
	fl.String("config", "", "settings file")
	fl.String("listen", "127.0.0.1:1", "address")
	fl.String("token", "", "a secret")
	fl.Duration("timeout", time.Minute, "a duration")
	fl.Int("count", 3, "an int")
	fl.Bool("watch", true, "a bool")
	fl.StringSlice("keys", nil, "a list")
	BytesFlag(fl, "max-bytes", 1<<20, "a size")
	return fl
}

var testSources = Sources{EnvPrefix: "TD", FileFlag: "config", FileOnly: []string{"section"}}

func writeSettings(t *testing.T, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "d.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestSettingsPrecedence: flag over environment over file over default, and
// the log names each key set twice with the source that won, never a value.
func TestSettingsPrecedence(t *testing.T) {
	file := writeSettings(t, "listen: 127.0.0.1:3\ntimeout: 3s\ncount: 30\nkeys: [file-a, file-b]\ntoken: tok-from-file\nmax-bytes: 32MiB\n")
	t.Setenv("TD_CONFIG", file)
	t.Setenv("TD_LISTEN", "127.0.0.1:2")
	t.Setenv("TD_TIMEOUT", "2s")
	t.Setenv("TD_TOKEN", "tok-from-env")
	t.Setenv("TD_WATCH", "false")
	t.Setenv("TD_COUNT", "") // empty: unset
	s, err := LoadSettings(testFlags(), []string{"--listen", "127.0.0.1:1", "--token", "tok-from-flag"}, testSources)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.String("listen"); got != "127.0.0.1:1" {
		t.Errorf("listen %q, want the flag's", got)
	}
	if got := s.String("token"); got != "tok-from-flag" {
		t.Errorf("token %q, want the flag's", got)
	}
	if got := s.Duration("timeout"); got != 2*time.Second {
		t.Errorf("timeout %v, want the environment's 2s", got)
	}
	if got := s.Bool("watch"); got {
		t.Errorf("watch true, want the environment's false")
	}
	if got := s.Int("count"); got != 30 {
		t.Errorf("count %d, want the file's 30", got)
	}
	if got := s.Strings("keys"); strings.Join(got, ",") != "file-a,file-b" {
		t.Errorf("keys %q, want the file's", got)
	}
	if got := s.Bytes("max-bytes"); got != 32<<20 {
		t.Errorf("max-bytes %d, want 32MiB", got)
	}

	for name, want := range map[string]bool{"listen": true, "timeout": true, "watch": true, "count": true, "keys": true, "max-bytes": true, "token": true} {
		if s.Given(name) != want {
			t.Errorf("Given(%q) = %t, want %t", name, !want, want)
		}
	}
	if s2, err := LoadSettings(testFlags(), nil, Sources{EnvPrefix: "TD_NONE"}); err != nil || s2.Given("count") || s2.Given("listen") {
		t.Errorf("defaults taken as given: %v", err)
	}

	var logs bytes.Buffer
	s.Log(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}})))
	want := `level=INFO msg="settings file read" path=` + file + `
level=INFO msg="setting overridden" key=listen from="flag --listen" overrides="environment TD_LISTEN, settings file ` + file + `"
level=INFO msg="setting overridden" key=token from="flag --token" overrides="environment TD_TOKEN, settings file ` + file + `"
level=INFO msg="setting overridden" key=timeout from="environment TD_TIMEOUT" overrides="settings file ` + file + `"
`
	if logs.String() != want {
		t.Errorf("log:\n%s\nwant:\n%s", logs.String(), want)
	}
}

// TestSettingsStrict: every value from the environment or the file is
// parsed as the flag would be, and a bad one names its key and source.
func TestSettingsStrict(t *testing.T) {
	for _, tt := range []struct {
		name, env, val, yaml string
		want                 string // the error, "" for none
	}{
		{name: "bare number of seconds", env: "TD_TIMEOUT", val: "300",
			want: `timeout: environment TD_TIMEOUT: invalid duration "300": a number with a unit, such as 90s, 5m or 1h30m`},
		{name: "not a duration", env: "TD_TIMEOUT", val: "abc",
			want: `timeout: environment TD_TIMEOUT: invalid duration "abc": a number with a unit, such as 90s, 5m or 1h30m`},
		{name: "not an int", env: "TD_COUNT", val: "5x", want: `count: environment TD_COUNT: invalid integer "5x"`},
		{name: "not a bool", env: "TD_WATCH", val: "yes please", want: `watch: environment TD_WATCH: invalid boolean "yes please": true or false`},
		{name: "size with a unit", env: "TD_MAX_BYTES", val: "32MiB"},
		{name: "bad size", env: "TD_MAX_BYTES", val: "32 parsecs",
			want: `max-bytes: environment TD_MAX_BYTES: invalid size "32 parsecs": bytes, or a whole number with a unit such as 512KiB, 32MiB or 1GB`},
		{name: "bad list, secret kept", env: "TD_KEYS", val: `sk-secret"x`, want: `keys: environment TD_KEYS: parse error on line 1, column 10: bare " in non-quoted-field`},
		{name: "file: bare number", yaml: "timeout: 300\n", want: `timeout: settings file FILE: invalid duration "300": a number with a unit, such as 90s, 5m or 1h30m`},
		{name: "file: size", yaml: "max-bytes: 1.5GiB\n", want: `max-bytes: settings file FILE: invalid size "1.5GiB": bytes, or a whole number with a unit such as 512KiB, 32MiB or 1GB`},
		{name: "file: yes is not a bool", yaml: "watch: yes\n", want: `watch: settings file FILE: invalid boolean "yes": true or false`},
		{name: "file: list for a value", yaml: "listen: [a, b]\n", want: `listen: settings file FILE: a list, where one value is expected`},
		{name: "file: mapping for a value", yaml: "count: {a: 1}\n", want: `count: settings file FILE: a mapping, where a value is expected`},
		{name: "file: list as a string", yaml: "keys: a,b\n"},
		{name: "file: unknown keys", yaml: "listne: 127.0.0.1:1\nsection: {a: 1}\nwatch_: true\n",
			want: "settings file FILE: unknown key \"listne\"\nsettings file FILE: unknown key \"watch_\""},
		{name: "file: the file's own key", yaml: "config: /etc/other.yaml\n",
			want: `settings file FILE: key "config": the file is named only by --config or TD_CONFIG`},
		{name: "every problem at once", env: "TD_TIMEOUT", val: "300", yaml: "count: many\ntypo: 1\n",
			want: "settings file FILE: unknown key \"typo\"\ntimeout: environment TD_TIMEOUT: invalid duration \"300\": a number with a unit, such as 90s, 5m or 1h30m\ncount: settings file FILE: invalid integer \"many\""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.env != "" {
				t.Setenv(tt.env, tt.val)
			}
			var args []string
			file := ""
			if tt.yaml != "" {
				file = writeSettings(t, tt.yaml)
				args = []string{"--config", file}
			}
			_, err := LoadSettings(testFlags(), args, testSources)
			want := strings.ReplaceAll(tt.want, "FILE", file)
			if (err == nil) != (want == "") || err != nil && err.Error() != want {
				t.Errorf("error:\n%v\nwant:\n%s", err, want)
			}
			if err != nil && strings.Contains(err.Error(), "sk-secret") {
				t.Errorf("the error repeats a secret: %v", err)
			}
		})
	}
}

func TestSettingsFile(t *testing.T) {
	// A file named by flag or environment must exist.
	missing := filepath.Join(t.TempDir(), "nope.yaml")
	if _, err := LoadSettings(testFlags(), []string{"--config", missing}, testSources); err == nil || !strings.Contains(err.Error(), `reading settings file "`+missing+`"`) {
		t.Errorf("missing --config: %v", err)
	}
	// The default file is read only when it exists.
	src := testSources
	src.DefaultFile = missing
	if s, err := LoadSettings(testFlags(), nil, src); err != nil || s.file != "" {
		t.Errorf("missing default file: %v, %q", err, s.file)
	}
	src.DefaultFile = writeSettings(t, "count: 7\nsection:\n  name: x\n  items: [a]\n")
	s, err := LoadSettings(testFlags(), nil, src)
	if err != nil || s.Int("count") != 7 || !s.IsSet("section") || s.IsSet("other") {
		t.Fatalf("default file: %v", err)
	}
	var section struct {
		Name  string
		Items []string
	}
	if err := s.Decode("section", &section); err != nil || section.Name != "x" || len(section.Items) != 1 {
		t.Errorf("Decode: %v, %+v", err, section)
	}
	var narrow struct{ Name string }
	if err := s.Decode("section", &narrow); err == nil || !strings.HasPrefix(err.Error(), "section: settings file "+src.DefaultFile+": ") || !strings.Contains(err.Error(), "items") {
		t.Errorf("Decode with an unknown key: %v", err)
	}
	// A command without a settings file reads only flags and environment.
	t.Setenv("TD_COUNT", "9")
	if s, err := LoadSettings(testFlags(), nil, Sources{EnvPrefix: "TD"}); err != nil || s.Int("count") != 9 {
		t.Errorf("no file: %v", err)
	}
}

func TestSettingsArgs(t *testing.T) {
	if _, err := LoadSettings(testFlags(), []string{"--help"}, testSources); !errors.Is(err, pflag.ErrHelp) {
		t.Errorf("--help: %v", err)
	}
	if _, err := LoadSettings(testFlags(), []string{"extra"}, testSources); err == nil || err.Error() != `unexpected arguments ["extra"]` {
		t.Errorf("extra: %v", err)
	}
	// The command line is as strict as ever.
	if _, err := LoadSettings(testFlags(), []string{"--max-bytes", "32MB"}, testSources); err != nil {
		t.Errorf("--max-bytes 32MB: %v", err)
	}
	if _, err := LoadSettings(testFlags(), []string{"--timeout", "300"}, testSources); err == nil {
		t.Errorf("--timeout 300 accepted")
	}
}

func TestBytes(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want int64
		str  string
	}{
		{"0", 0, "0"},
		{"1000", 1000, "1000"},
		{"1024", 1024, "1024"},
		{"1048576", 1 << 20, "1MiB"},
		{"33554432", 32 << 20, "32MiB"},
		{"32MiB", 32 << 20, "32MiB"},
		{"32mib", 32 << 20, "32MiB"},
		{"32 MiB", 32 << 20, "32MiB"},
		{"1kB", 1000, "1000"},
		{"2GB", 2e9, "2000000000"},
		{"3GiB", 3 << 30, "3GiB"},
		{"1TiB", 1 << 40, "1TiB"},
		{"512B", 512, "512"},
	} {
		var b bytesValue
		if err := b.Set(tt.in); err != nil || int64(b) != tt.want || b.String() != tt.str {
			t.Errorf("Set(%q): %v, %d %q; want %d %q", tt.in, err, int64(b), b.String(), tt.want, tt.str)
		}
	}
	for _, in := range []string{"", "MiB", "-1", "1.5GiB", "32 parsecs", "0x10", "9999999TiB", "1 2"} {
		var b bytesValue
		if err := b.Set(in); err == nil {
			t.Errorf("Set(%q) = %d, want an error", in, int64(b))
		}
	}
}

// File names the settings file read, and is empty without one.
func TestSettingsFileRead(t *testing.T) {
	file := writeSettings(t, "count: 4\n")
	s, err := LoadSettings(testFlags(), []string{"--config", file}, testSources)
	if err != nil {
		t.Fatal(err)
	}
	if s.File() != file {
		t.Errorf("File() = %q, want %q", s.File(), file)
	}
	if s, err = LoadSettings(testFlags(), nil, testSources); err != nil || s.File() != "" {
		t.Errorf("without a settings file: File() = %q, %v", s.File(), err)
	}
	if (*Settings)(nil).File() != "" {
		t.Error("a nil Settings has a file")
	}
}
