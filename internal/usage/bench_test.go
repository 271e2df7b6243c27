package usage

import (
	"path/filepath"
	"testing"
)

// BenchmarkLedgerRequest is the ledger's whole cost per request: queueing
// the row and the writer's share of committing it.
func BenchmarkLedgerRequest(b *testing.B) {
	l := openLedger(b, Options{Path: filepath.Join(b.TempDir(), "usage.db")})
	rec := requestRecord(1, "a")
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		l.Request(rec)
	}
	if err := l.Close(); err != nil {
		b.Fatal(err)
	}
}
