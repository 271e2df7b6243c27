package profile

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// UnmarshalJSON decodes a Go duration string. null leaves d unchanged. A string that
// is not a valid duration is kept as written and decodes to zero; Parse reports it.
func (d *Duration) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return errors.New("duration must be a string such as \"90s\"")
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		v = 0
	}
	*d = Duration{Duration: v, text: s, given: true}
	return nil
}

// MarshalJSON encodes d as a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(d.Duration.String())
}

// IsZero reports whether d is unset.
func (d Duration) IsZero() bool { return d.Duration == 0 && !d.given }

// problem returns why d is not a valid setting, or "" when it is valid or unset.
// Zero is valid only when zeroOK is set.
func (d Duration) problem(zeroOK bool) string {
	if d.given {
		v, err := time.ParseDuration(d.text)
		if err != nil {
			if _, nerr := strconv.ParseFloat(d.text, 64); nerr == nil {
				return fmt.Sprintf("invalid duration %q: a duration needs a unit, such as \"%ss\"", d.text, d.text)
			}
			return fmt.Sprintf("invalid duration %q", d.text)
		}
		switch {
		case v < 0 && zeroOK:
			return fmt.Sprintf("%q is negative", d.text)
		case v <= 0 && !zeroOK:
			return fmt.Sprintf("%q is not positive", d.text)
		}
		return ""
	}
	if d.Duration < 0 {
		return fmt.Sprintf("%v is not positive", d.Duration)
	}
	return ""
}

// or returns d when set, else def when set, else fallback.
func (d Duration) or(def Duration, fallback time.Duration) Duration {
	switch {
	case !d.IsZero():
		return d
	case !def.IsZero():
		return def
	}
	return Duration{Duration: fallback}
}
