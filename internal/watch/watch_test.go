package watch

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// watchFor starts Watch on path with debounce and returns its channel; the
// watcher ends with the test.
func watchFor(t *testing.T, path string, debounce time.Duration) <-chan struct{} {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := File(ctx, path, debounce, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		for range ch { // closed once the watcher has ended
		}
	})
	return ch
}

func waitReport(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case _, ok := <-ch:
		if !ok {
			t.Fatalf("%s: watcher ended", what)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: no report within 5s", what)
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// configMap lays out dir as a Kubernetes ConfigMap volume does:
// profiles.json → ..data/profiles.json, ..data → <version>/.
func configMap(t *testing.T, dir, version, content string) {
	t.Helper()
	if err := os.Mkdir(filepath.Join(dir, version), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, version, "profiles.json"), content)
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(version, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
}

func TestWatchReplacementStyles(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(t *testing.T, dir string) string // returns the watched path
		replace func(t *testing.T, dir, path string)
	}{
		{
			name:  "in-place write",
			setup: plainFile,
			replace: func(t *testing.T, dir, path string) {
				f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := f.WriteString(`{"v": 2}`); err != nil {
					t.Fatal(err)
				}
				f.Close()
			},
		},
		{
			name:  "write temp and rename",
			setup: plainFile,
			replace: func(t *testing.T, dir, path string) {
				tmp := filepath.Join(dir, ".profiles.json.tmp")
				write(t, tmp, `{"v": 2}`)
				if err := os.Rename(tmp, path); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name:  "delete and create",
			setup: plainFile,
			replace: func(t *testing.T, dir, path string) {
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
				write(t, path, `{"v": 2}`)
			},
		},
		{
			name: "configmap ..data flip",
			setup: func(t *testing.T, dir string) string {
				configMap(t, dir, "..v1", `{"v": 1}`)
				path := filepath.Join(dir, "profiles.json")
				if err := os.Symlink("..data/profiles.json", path); err != nil {
					t.Fatal(err)
				}
				return path
			},
			replace: func(t *testing.T, dir, path string) {
				configMap(t, dir, "..v2", `{"v": 2}`)
				if err := os.RemoveAll(filepath.Join(dir, "..v1")); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "git-sync link flip",
			setup: func(t *testing.T, dir string) string {
				for _, v := range []string{"wt1", "wt2"} {
					if err := os.MkdirAll(filepath.Join(dir, "worktrees", v), 0o755); err != nil {
						t.Fatal(err)
					}
					write(t, filepath.Join(dir, "worktrees", v, "profiles.json"), `{"v": "`+v+`"}`)
				}
				if err := os.Symlink(filepath.Join(dir, "worktrees", "wt1"), filepath.Join(dir, "current")); err != nil {
					t.Fatal(err)
				}
				return filepath.Join(dir, "current", "profiles.json")
			},
			replace: func(t *testing.T, dir, path string) {
				tmp := filepath.Join(dir, "current.tmp")
				if err := os.Symlink("worktrees/wt2", tmp); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(tmp, filepath.Join(dir, "current")); err != nil {
					t.Fatal(err)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := tt.setup(t, dir)
			ch := watchFor(t, path, 0)
			tt.replace(t, dir, path)
			waitReport(t, ch, "first change")
			got, err := os.ReadFile(path)
			if err != nil || string(got) == `{"v": 1}` || string(got) == `{"v": "wt1"}` {
				t.Fatalf("after the report the file reads %q, %v; want the new content", got, err)
			}
			// The watch follows the replacement: a second change is seen too.
			drain(ch)
			write(t, path, `{"v": 3}`)
			waitReport(t, ch, "write after the replacement")
		})
	}
}

func plainFile(t *testing.T, dir string) string {
	path := filepath.Join(dir, "profiles.json")
	write(t, path, `{"v": 1}`)
	return path
}

func drain(ch <-chan struct{}) {
	select {
	case <-ch:
	default:
	}
}

// TestWatchDebounce checks that a burst yields one report, no sooner than the
// debounce after the burst's last event.
func TestWatchDebounce(t *testing.T) {
	dir := t.TempDir()
	path := plainFile(t, dir)
	const debounce = 300 * time.Millisecond
	ch := watchFor(t, path, debounce)
	for i := range 20 {
		write(t, path, `{"v": `+string(rune('a'+i))+`}`)
	}
	last := time.Now()
	waitReport(t, ch, "burst")
	if d := time.Since(last); d < debounce {
		t.Fatalf("report %v after the burst's last write, want at least the debounce %v", d, debounce)
	}
	select {
	case <-ch:
		t.Fatal("a second report for one burst")
	default:
	}
}

func TestResolve(t *testing.T) {
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	configMap(t, dir, "..v1", "{}")
	link := filepath.Join(dir, "profiles.json")
	if err := os.Symlink("..data/profiles.json", link); err != nil {
		t.Fatal(err)
	}
	links, final := resolve(link)
	wantLinks := []string{link, filepath.Join(dir, "..data")}
	if !slices.Equal(links, wantLinks) || final != filepath.Join(dir, "..v1", "profiles.json") {
		t.Fatalf("resolve = %q, %q; want %q, %q", links, final, wantLinks, filepath.Join(dir, "..v1", "profiles.json"))
	}
	// A missing file resolves to itself, so that its directory is watched.
	missing := filepath.Join(dir, "nope", "x.json")
	if links, final := resolve(missing); len(links) != 0 || final != filepath.Join(dir, "nope") {
		t.Fatalf("resolve(missing) = %q, %q; want no links and %q", links, final, filepath.Join(dir, "nope"))
	}
}
