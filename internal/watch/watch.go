// Package watch tells a daemon that a file it reads may have changed: the
// profiles file, fleetd's hosts file, the tenants file. It follows the ways a
// GitOps agent replaces a file (renames, symlink flips) by watching
// directories with fsnotify.
package watch

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
)

// File reports, on the returned channel, that the file at path may have new
// content. It watches directories, not the file, so that every way a GitOps
// agent replaces a file is seen: an in-place write, a write to a temporary file
// renamed over path, a delete followed by a create, and a symlink flip anywhere
// on the way to the file (git-sync's `--link`, or the `..data` link of a
// Kubernetes ConfigMap volume). Events are debounced: one report follows a burst
// once debounce has passed without another event; a zero debounce reports at
// once. The channel holds at most one pending report (reports coalesce) and is
// closed when ctx ends. The caller compares the content itself: a report is a
// hint, not a promise that the bytes changed.
func File(ctx context.Context, path string, debounce time.Duration, log *slog.Logger) (<-chan struct{}, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("watching %q: %w", path, err)
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watching %q: %w", path, err)
	}
	w := &watcher{path: abs, fw: fw, log: log, dirs: make(map[string]bool)}
	if err := w.rewatch(); err != nil {
		fw.Close()
		return nil, err
	}
	out := make(chan struct{}, 1)
	go w.run(ctx, debounce, out)
	return out, nil
}

// watcher is Watch's state; only its run goroutine uses it after Watch returns.
type watcher struct {
	path  string // absolute, as given
	fw    *fsnotify.Watcher
	log   *slog.Logger
	dirs  map[string]bool // directories watched now
	names map[string]bool // entries whose change can change what path reads
}

func (w *watcher) run(ctx context.Context, debounce time.Duration, out chan<- struct{}) {
	defer close(out)
	defer w.fw.Close()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.fw.Events:
			if !ok {
				return
			}
			if ev.Op == fsnotify.Chmod || !w.names[ev.Name] {
				continue
			}
			w.log.Debug("profiles file event", "event", ev.String())
			// Watch a newly linked directory at once, so that a write into it
			// during the debounce is not missed.
			if err := w.rewatch(); err != nil {
				w.log.Warn("watching profiles", "err", err)
			}
			timer.Reset(debounce)
		case err, ok := <-w.fw.Errors:
			if !ok {
				return
			}
			w.log.Warn("watching profiles", "err", err)
		case <-timer.C:
			if err := w.rewatch(); err != nil {
				w.log.Warn("watching profiles", "err", err)
			}
			select {
			case out <- struct{}{}:
			default:
			}
		}
	}
}

// rewatch resolves the path again and watches exactly the directories that
// hold an entry on its way: each symlink followed and the final file.
func (w *watcher) rewatch() error {
	links, final := resolve(w.path)
	w.names = make(map[string]bool, len(links)+1)
	want := make(map[string]bool, len(links)+1)
	for _, n := range append(links, final) {
		w.names[n] = true
		want[filepath.Dir(n)] = true
	}
	var firstErr error
	for d := range want {
		if w.dirs[d] {
			continue
		}
		if err := w.fw.Add(d); err != nil {
			// A directory on the way may be missing for now; its parent's
			// watch sees it come back.
			if firstErr == nil && !os.IsNotExist(err) {
				firstErr = fmt.Errorf("watching directory %q: %w", d, err)
			}
			continue
		}
		w.dirs[d] = true
	}
	for d := range w.dirs {
		if !want[d] {
			_ = w.fw.Remove(d) // it may be gone already (the old side of a flip)
			delete(w.dirs, d)
		}
	}
	return firstErr
}

// maxLinks bounds symlink resolution, as the kernel's ELOOP does.
const maxLinks = 40

// resolve follows path one component at a time and returns every symlink met
// (each as its real parent directory joined with its name) and the real path
// reached. Resolution stops at the first missing component, which is returned
// as final, so that its parent can be watched for it to appear.
func resolve(path string) (links []string, final string) {
	todo := strings.Split(strings.TrimPrefix(filepath.Clean(path), "/"), "/")
	cur := "/"
	for n := 0; len(todo) > 0; {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, c)
		fi, err := os.Lstat(next)
		if err != nil || fi.Mode()&os.ModeSymlink == 0 || n >= maxLinks {
			if err != nil || len(todo) == 0 {
				return links, next
			}
			cur = next
			continue
		}
		n++
		links = append(links, next)
		target, err := os.Readlink(next)
		if err != nil {
			return links, next
		}
		if filepath.IsAbs(target) {
			cur = "/"
		}
		todo = append(strings.Split(target, "/"), todo...)
	}
	return links, cur
}
