package usage

import (
	"database/sql"
	"time"

	"github.com/poold/poold/internal/activity"
)

// The writer's pool intervals: each pool's current one is held in memory
// (Ledger.open), checkpointed once a second, and becomes a row when the
// pool's activity changes.

// applyActivity ends the pool's current interval at the change, returning
// it as a row to write (nil when there is none: no change, or one of zero
// length never checkpointed), and begins the next (none after
// activity.None).
func (l *Ledger) applyActivity(c *change, at time.Time) *interval {
	cur := l.open[c.pool]
	if cur != nil && cur.Activity == c.activity && cur.Profile == c.profile {
		return nil
	}
	var ended *interval
	if cur != nil {
		delete(l.open, c.pool)
		if cur.Seq != 0 || at.After(cur.Start) {
			cur.End = at
			ended = cur
		}
	}
	if c.activity == activity.None {
		return ended
	}
	model := ""
	if l.opts.GPUModel != nil {
		model = l.opts.GPUModel(c.gpus)
	}
	l.open[c.pool] = &interval{Pool: c.pool, Activity: c.activity, Profile: c.profile, GPUs: c.gpus, GPUModel: model, Start: at}
	return ended
}

// endInterval writes an ended interval: its checkpointed row in st, when it
// has one there, else a new row.
func (l *Ledger) endInterval(tx *sql.Tx, st *store, iv *interval) error {
	if iv.Seq != 0 && iv.Ledger == st.id {
		_, err := tx.Exec(`UPDATE intervals SET end_us = ?, is_open = 0 WHERE seq = ?`, iv.End.UnixMicro(), iv.Seq)
		return err
	}
	if !iv.End.After(iv.Start) {
		return nil
	}
	_, err := l.insertInterval(tx, iv, iv.End, false)
	return err
}

func (l *Ledger) insertInterval(tx *sql.Tx, iv *interval, end time.Time, open bool) (int64, error) {
	res, err := tx.Exec(`INSERT INTO intervals (pool, activity, profile, gpus, gpu_model, start_us, end_us, is_open)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?)`, iv.Pool, string(iv.Activity), iv.Profile, formatGPUs(iv.GPUs), iv.GPUModel,
		iv.Start.UnixMicro(), end.UnixMicro(), open)
	if err != nil {
		return 0, err
	}
	return res.LastInsertId()
}

// checkpointOpen writes each open interval's row, with now as its end so
// far: a report sees the time up to now, and a crash loses at most a
// second of it. A failed checkpoint is tried again at the next.
func (l *Ledger) checkpointOpen(now time.Time) {
	st := l.cur
	seqs := make(map[*interval]int64)
	err := l.commit(st, "checkpoint", func(tx *sql.Tx) error {
		for _, iv := range l.open {
			if iv.Seq != 0 && iv.Ledger == st.id {
				if _, err := tx.Exec(`UPDATE intervals SET end_us = ? WHERE seq = ?`, now.UnixMicro(), iv.Seq); err != nil {
					return err
				}
				continue
			}
			end := now
			if end.Before(iv.Start) {
				end = iv.Start
			}
			seq, err := l.insertInterval(tx, iv, end, true)
			if err != nil {
				return err
			}
			seqs[iv] = seq
		}
		return nil
	})
	if err != nil {
		l.failed(err)
		return
	}
	for iv, seq := range seqs {
		iv.Ledger, iv.Seq = st.id, seq
	}
	l.retryAt = time.Time{}
	l.settle()
}

// closeOpen ends every open interval at now (at Close: the pools have
// reported their end already, unless something still ran) and saves them.
func (l *Ledger) closeOpen(now time.Time) {
	var rows []row
	for name, iv := range l.open {
		if iv.Seq != 0 || now.After(iv.Start) {
			iv.End = now
			rows = append(rows, row{Interval: iv})
		}
		delete(l.open, name)
	}
	l.save(rows, now)
}
