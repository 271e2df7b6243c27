package openai

import (
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// RequestID takes the client's X-Request-Id when it is sane, else makes one
// from prefix and the next value of seq.
func RequestID(r *http.Request, prefix string, seq *atomic.Uint64) string {
	if id := r.Header.Get("X-Request-Id"); id != "" && len(id) <= 128 && printable(id) {
		return id
	}
	return prefix + "-" + strconv.FormatUint(seq.Add(1), 36) + "-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
