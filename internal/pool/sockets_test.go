package pool

import "testing"

func TestPortInUseMessages(t *testing.T) {
	for line, want := range map[string]bool{
		"OSError: [Errno 98] Address already in use":                               true,
		"ERROR: [Errno 98] error while attempting to bind: address already in use": true,
		"RuntimeError: Port 8000 is already in use":                                true,
		"listen tcp 127.0.0.1:8000: bind: ADDRESS ALREADY IN USE":                  true,
		"CUDA device is already in use by another process":                         false,
		"loading weights": false,
	} {
		if got := portInUse.MatchString(line); got != want {
			t.Errorf("%q: %v, want %v", line, got, want)
		}
	}
}
