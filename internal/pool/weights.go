package pool

import (
	"io/fs"
	"os"
	"path/filepath"

	"github.com/poold/poold/internal/profile"
)

// weightBytes is the host RAM a level-1 sleeper of prof holds: its
// weightBytes, else the size of its model directory where readable, else 0
// (unknown).
func weightBytes(prof *profile.Profile) int64 {
	if prof.WeightBytes > 0 {
		return prof.WeightBytes
	}
	return dirSize(prof.Model, 100_000)
}

// dirSize sums the sizes of the regular files under dir (following symlinks,
// as a Hugging Face snapshot links into its blobs), visiting at most max
// entries; 0 when dir is not a readable directory.
func dirSize(dir string, max int) int64 {
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return 0
	}
	var total int64
	seen := 0
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if seen++; seen > max {
			return fs.SkipAll
		}
		if err != nil || d.IsDir() {
			return nil
		}
		if st, err := os.Stat(path); err == nil && st.Mode().IsRegular() {
			total += st.Size()
		}
		return nil
	})
	return total
}
