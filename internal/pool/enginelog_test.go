package pool

import "testing"

func TestNoteLines(t *testing.T) {
	for _, tt := range []struct {
		line string
		want uint32
	}{
		{"OSError: [Errno 98] Address already in use", notePortTaken},
		{"ERROR 11-30 12:00:00 [api_server.py:1] Port 8000 is already in use", notePortTaken},
		{"listen tcp 127.0.0.1:8000: bind: address already in use", notePortTaken},
		{"PORT 41873 IS ALREADY IN USE", notePortTaken},
		{"ValueError: Free memory on device cuda:0 (8.00/10.00 GiB) on startup is less than desired GPU memory utilization (0.9, 9.00 GiB).", noteMemoryShort},
		{"INFO: the port is already in use by nobody", 0},
		{"Loading safetensors checkpoint shards: 100%", 0},
	} {
		e := &engine{}
		e.note(tt.line)
		if got := e.noted.Load(); got != tt.want {
			t.Errorf("%q: noted %b, want %b", tt.line, got, tt.want)
		}
	}
}
