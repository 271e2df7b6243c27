package usage

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"time"

	"github.com/poold/poold/internal/activity"
	"github.com/poold/poold/internal/record"
)

// row is a row for the database: a finished request's (Request, which
// ended at End) or a pool's ended interval (Interval). Run and N are its
// place in the spool: the run of poold that spooled it and its number in
// that run, zero until it is spooled. A row is written at most once per
// database: the database keeps each run's last N written (its mark), and
// rows at or below it are skipped, so a row both in the spool file and in
// memory, or replayed twice, is written once.
type row struct {
	Run      string          `json:"run"`
	N        uint64          `json:"n"`
	Request  *record.Request `json:"request,omitempty"`
	End      time.Time       `json:"end"`
	Interval *interval       `json:"interval,omitempty"`
}

// interval is a pool's interval: open while the writer holds it, ended (End
// set) once it is a row. Ledger and Seq name its row in a database once a
// checkpoint wrote it there; Seq is 0 before.
type interval struct {
	Pool     string            `json:"pool"`
	Activity activity.Activity `json:"activity"`
	Profile  string            `json:"profile"`
	GPUs     []int             `json:"gpus"`
	GPUModel string            `json:"gpuModel"`
	Start    time.Time         `json:"start"`
	End      time.Time         `json:"end"`
	Ledger   string            `json:"ledger,omitempty"`
	Seq      int64             `json:"seq,omitempty"`
}

// kind is the row's kind, for counts and metric labels.
func (r *row) kind() int {
	if r.Request != nil {
		return kindRequest
	}
	return kindInterval
}

// spool is the file beside the database where rows wait that the database
// did not take (usage.db.spool): JSON, one row a line, appended to and
// synced, replayed into the database once it can be written, then removed.
// Its zero value is unusable; it is the writer's.
type spool struct {
	path string
	max  int64 // the most bytes the file may hold
	size int64 // bytes in the file (0: empty or absent)
	rows int   // rows in the file
}

// openSpool finds what a previous run left in the spool file at path.
func openSpool(path string, max int64) (*spool, error) {
	s := &spool{path: path, max: max}
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("usage spool %s: %w", path, err)
	}
	s.size, s.rows = int64(len(b)), bytes.Count(b, []byte{'\n'})
	return s, nil
}

// append adds rows to the file and syncs it. On an error the file is cut
// back to its size before, so that no partial line is left for the next
// rows to follow; should some of them stay in it, their marks keep them
// from being written twice.
func (s *spool) append(rows []row) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for i := range rows {
		if err := enc.Encode(&rows[i]); err != nil {
			return fmt.Errorf("encoding a spooled row: %w", err)
		}
	}
	if s.size+int64(buf.Len()) > s.max {
		return fmt.Errorf("the spool file %s is full (%d bytes)", s.path, s.max)
	}
	f, err := os.OpenFile(s.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(buf.Bytes())
	if err == nil {
		err = f.Sync()
	}
	if err != nil {
		_ = f.Truncate(s.size)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing the spool file %s: %w", s.path, err)
	}
	s.size += int64(buf.Len())
	s.rows += len(rows)
	return nil
}

// read returns the file's rows. A line that does not parse (the last one,
// cut by a crash during its write) is skipped and logged.
func (s *spool) read(log *slog.Logger) ([]row, error) {
	b, err := os.ReadFile(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the spool file %s: %w", s.path, err)
	}
	rows := make([]row, 0, bytes.Count(b, []byte{'\n'}))
	for line := range bytes.Lines(b) {
		var r row
		if err := json.Unmarshal(line, &r); err != nil || (r.Request == nil) == (r.Interval == nil) {
			log.Error("usage ledger: skipped a spooled row that does not parse", "spool", s.path, "line", string(bytes.TrimSpace(line)), "err", err)
			continue
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// clear removes the file once its rows are written.
func (s *spool) clear() error {
	s.size, s.rows = 0, 0
	if err := os.Remove(s.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing the spool file %s: %w", s.path, err)
	}
	return nil
}
