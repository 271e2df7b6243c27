package engine

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// A state directory that only its owner may write is taken, with its
// symbolic links resolved; one that others may write, or a file in it that
// is a symbolic link or writable by others, is refused with ErrUntrusted; a
// missing file is no error.
func TestCheckStateDir(t *testing.T) {
	uid := os.Geteuid()
	root := t.TempDir()
	dir := filepath.Join(root, "state")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(root, "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	want, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := CheckStateDir(link, uid); err != nil || got != want {
		t.Fatalf("CheckStateDir(%s) = %q, %v; want %q", link, got, err, want)
	}

	file := filepath.Join(dir, "engines.json")
	if exists, err := CheckFile(file, uid); exists || err != nil {
		t.Errorf("missing file: exists %v, err %v; want false, nil", exists, err)
	}
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if exists, err := CheckFile(file, uid); !exists || err != nil {
		t.Errorf("own file: exists %v, err %v; want true, nil", exists, err)
	}
	if err := os.Chmod(file, 0o666); err != nil {
		t.Fatal(err)
	}
	if _, err := CheckFile(file, uid); !errors.Is(err, ErrUntrusted) {
		t.Errorf("file writable by others: %v, want ErrUntrusted", err)
	}
	fileLink := filepath.Join(dir, "lock")
	if err := os.Symlink(file, fileLink); err != nil {
		t.Fatal(err)
	}
	if _, err := CheckFile(fileLink, uid); !errors.Is(err, ErrUntrusted) {
		t.Errorf("symbolic link: %v, want ErrUntrusted", err)
	}

	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := CheckStateDir(dir, uid); !errors.Is(err, ErrUntrusted) {
		t.Errorf("directory writable by others: %v, want ErrUntrusted", err)
	}
}
