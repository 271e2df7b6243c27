package main

import (
	"io"
	"log/slog"
	"sync/atomic"
)

// lossWriter passes writes to w and warns on log when they start failing (a
// full disk, a removed file system): the access log degrades, the daemon
// keeps serving. It warns once per run of failures.
type lossWriter struct {
	w       io.Writer
	log     *slog.Logger
	failing atomic.Bool // the last write failed
}

func (l *lossWriter) Write(p []byte) (int, error) {
	n, err := l.w.Write(p)
	if err != nil {
		if l.failing.CompareAndSwap(false, true) {
			l.log.Warn("access log write failed; access log lines are being lost", "err", err)
		}
		return n, err
	}
	if l.failing.CompareAndSwap(true, false) {
		l.log.Info("access log writes work again")
	}
	return n, nil
}
