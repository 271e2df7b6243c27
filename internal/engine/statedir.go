package engine

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Trust in the state directory: poold acts on what it finds there (it
// signals the processes the ledger names and removes the files and cgroups
// it names) only when nobody but poold's user, or root, could have put it
// there. The rule, for poold's effective uid:
//   - the directory is owned by that uid and writable by nobody else (no
//     group or other write bit);
//   - each of its ancestors, symbolic links resolved, is owned by root or
//     that uid, and is writable by nobody else unless it has the sticky
//     bit (then others may not rename or remove what they do not own, as
//     in /tmp);
//   - every file poold reads or removes there (the lock, engines.json, the
//     shims' sockets) is owned by that uid, writable by nobody else, and
//     not a symbolic link.

// ErrUntrusted is wrapped by the errors that refuse a state directory, or a
// file in it, that others could have written.
var ErrUntrusted = errors.New("state directory not trusted")

// untrusted is the refusal of path: why, and the fix.
func untrusted(path, why, fix string) error {
	return fmt.Errorf("%w: %s %s: %s", ErrUntrusted, path, why, fix)
}

// CheckStateDir checks dir, for the effective uid uid, by the rule above and
// returns it with symbolic links resolved: poold works in that path from then
// on, so that a link changed later does not move it. A refusal wraps
// ErrUntrusted and names the fix.
func CheckStateDir(dir string, uid int) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("state directory %s: %w", dir, err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", fmt.Errorf("state directory %s: %w", dir, err)
	}
	fi, err := os.Stat(real)
	if err != nil {
		return "", fmt.Errorf("state directory %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("state directory %s is not a directory", real)
	}
	if err := checkOwned(real, fi, uid); err != nil {
		return "", err
	}
	for p := filepath.Dir(real); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return "", fmt.Errorf("state directory %s: %w", dir, err)
		}
		owner := fileOwner(fi)
		switch {
		case owner != 0 && owner != uid:
			return "", untrusted(real, fmt.Sprintf("is in %s, owned by uid %d (neither root nor poold's user, uid %d), who can replace it", p, owner, uid),
				"give poold a state directory whose parents belong to root (--state-dir, or the unit's StateDirectory=)")
		case fi.Mode().Perm()&0o022 != 0 && fi.Mode()&fs.ModeSticky == 0:
			return "", untrusted(real, fmt.Sprintf("is in %s (mode %04o), which others may write without the sticky bit, so they can replace it", p, fi.Mode().Perm()),
				"run chmod go-w "+p+" (or chmod +t "+p+"), or give poold another --state-dir")
		}
		if p == filepath.Dir(p) {
			return real, nil
		}
	}
}

// checkOwned refuses path, whose information is fi, unless it is owned by
// uid and writable by nobody else; the error names the fix.
func checkOwned(path string, fi fs.FileInfo, uid int) error {
	if owner := fileOwner(fi); owner != uid {
		return untrusted(path, fmt.Sprintf("is owned by uid %d, not by poold's user (uid %d)", owner, uid),
			fmt.Sprintf("run chown %d %s, or, if uid %d is poold's user, run poold (and poold stop-engines) as that user", uid, path, owner))
	}
	if perm := fi.Mode().Perm(); perm&0o022 != 0 {
		return untrusted(path, fmt.Sprintf("is writable by others than poold's user (mode %04o)", perm),
			fmt.Sprintf("run chmod %04o %s", perm&^0o022&^0o005, path))
	}
	return nil
}

// CheckFile checks the file at path in the state directory, if there is
// one: not a symbolic link, owned by uid and writable by nobody else (a
// refusal wraps ErrUntrusted). A missing file is no error (exists is false).
func CheckFile(path string, uid int) (exists bool, err error) {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case err != nil:
		return false, err
	case fi.Mode()&fs.ModeSymlink != 0:
		return true, untrusted(path, "is a symbolic link", "remove it")
	}
	return true, checkOwned(path, fi, uid)
}

// fileOwner is the uid that owns the file fi describes.
func fileOwner(fi fs.FileInfo) int {
	return int(fi.Sys().(*syscall.Stat_t).Uid)
}
