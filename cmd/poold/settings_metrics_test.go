package main

import "testing"

// TestMetricsSetting: request metrics are on by default and can be turned off
// by flag, environment or settings file.
func TestMetricsSetting(t *testing.T) {
	t.Setenv("POOLD_CONFIG", writeYAML(t, "{}\n"))
	for _, tc := range []struct {
		name, env, file string
		args            []string
		want            bool
	}{
		{name: "default", want: true},
		{name: "flag", args: []string{"--metrics=false"}, want: false},
		{name: "env", env: "false", want: false},
		{name: "file", file: "metrics: false\n", want: false},
		{name: "flag wins", env: "false", args: []string{"--metrics=true"}, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("POOLD_METRICS", tc.env)
			if tc.file != "" {
				t.Setenv("POOLD_CONFIG", writeYAML(t, tc.file))
			}
			s, err := loadSettings(append([]string{"--profiles", "p.json"}, tc.args...))
			if err != nil {
				t.Fatal(err)
			}
			if s.Metrics != tc.want {
				t.Fatalf("metrics = %v, want %v", s.Metrics, tc.want)
			}
		})
	}
}
