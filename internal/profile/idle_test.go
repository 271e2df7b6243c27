package profile

import (
	"testing"
	"time"
)

// idleTimeout and maxKeepAlive default from the file's defaults; an unset
// maxKeepAlive is the profile's idleTimeout, so that a client may shorten
// the stay but not lengthen it; a profile's "0s" opts out of the default.
func TestIdleSettings(t *testing.T) {
	c, err := Parse([]byte(`{
	  "defaults": {"idleTimeout": "5m"},
	  "pools": [{"name": "a", "gpus": [0]}],
	  "profiles": [
	    {"id": "plain", "model": "m"},
	    {"id": "never", "model": "m", "idleTimeout": "0s"},
	    {"id": "longer", "model": "m", "idleTimeout": "1m", "maxKeepAlive": "1h"}
	  ]}`))
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string][2]time.Duration{
		"plain":  {5 * time.Minute, 5 * time.Minute},
		"never":  {0, 0},
		"longer": {time.Minute, time.Hour},
	} {
		p := c.Lookup(id)
		if got := [2]time.Duration{p.IdleTimeout.Duration, p.MaxKeepAlive.Duration}; got != want {
			t.Errorf("%s: idleTimeout, maxKeepAlive = %v, want %v", id, got, want)
		}
	}
	c2, err := Parse([]byte(`{
	  "defaults": {"idleTimeout": "5m", "maxKeepAlive": "2h"},
	  "pools": [{"name": "a", "gpus": [0]}],
	  "profiles": [{"id": "plain", "model": "m"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := c2.Lookup("plain").MaxKeepAlive.Duration; got != 2*time.Hour {
		t.Errorf("maxKeepAlive from defaults = %v, want 2h", got)
	}
	q := *c2.Lookup("plain")
	q.IdleTimeout.Duration = time.Minute
	if c2.Lookup("plain").Equal(&q) {
		t.Errorf("profiles differing in idleTimeout compare equal")
	}
}
