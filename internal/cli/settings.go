package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
)

// Sources say where a command's settings come from besides its flags.
type Sources struct {
	// EnvPrefix names the environment variables: flag --max-body-bytes is
	// also PREFIX_MAX_BODY_BYTES. An empty variable counts as unset.
	EnvPrefix string
	// FileFlag names the flag (also read from the environment) that gives
	// the YAML settings file; empty means the command reads no file.
	FileFlag string
	// DefaultFile is the settings file read when FileFlag is not given and
	// the file exists.
	DefaultFile string
	// FileOnly are the keys that only the settings file may set: sections
	// that Settings.Decode reads.
	FileOnly []string
}

// Settings are a command's settings, loaded by LoadSettings: each flag's
// value comes from the command line, else the environment, else the
// settings file, else the flag's default.
type Settings struct {
	fl   *pflag.FlagSet
	file string       // the settings file read; "" when none
	v    *viper.Viper // the settings file's contents
	// overrides lists each key set by more than one source, with the
	// source that won and the ones it hid.
	overrides []override
	// given holds each flag that a source set (the command line, the
	// environment or the settings file): absent, it has its default.
	given map[string]bool
}

type override struct {
	key, won string
	hid      []string
}

// LoadSettings parses args into fl, then gives every flag not on the
// command line its value from the environment or the settings file, parsed
// as strictly as the flag would be: a value that does not parse is an error
// naming the key and its source, and so is a key in the settings file that
// is neither a flag nor one of src.FileOnly. -h or --help returns
// pflag.ErrHelp.
func LoadSettings(fl *pflag.FlagSet, args []string, src Sources) (*Settings, error) {
	if err := fl.Parse(args); err != nil {
		return nil, err
	}
	if fl.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fl.Args())
	}
	s := &Settings{fl: fl, v: viper.New(), given: map[string]bool{}}
	var errs []error
	if src.FileFlag != "" {
		if err := s.fromEnv(fl.Lookup(src.FileFlag), src.EnvPrefix); err != nil {
			return nil, err
		}
		if err := s.readFile(src); err != nil {
			return nil, err
		}
		errs = s.unknownKeys(src)
	}
	fl.VisitAll(func(f *pflag.Flag) {
		if f.Name == src.FileFlag {
			return
		}
		won, hid := s.sourcesOf(f, src.EnvPrefix)
		s.given[f.Name] = won != ""
		if len(hid) > 0 {
			s.overrides = append(s.overrides, override{key: f.Name, won: won, hid: hid})
		}
		var err error
		switch {
		case f.Changed:
		case strings.HasPrefix(won, "environment "):
			err = s.fromEnv(f, src.EnvPrefix)
		case won != "":
			err = s.fromFile(f)
		}
		if err != nil {
			errs = append(errs, err)
		}
	})
	return s, errors.Join(errs...)
}

// envName is the environment variable of the flag name under prefix.
func envName(prefix, name string) string {
	return prefix + "_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// sourcesOf names the source of f's value ("" for its default) and the
// other sources that set it too.
func (s *Settings) sourcesOf(f *pflag.Flag, prefix string) (won string, hid []string) {
	var set []string
	if f.Changed {
		set = append(set, "flag --"+f.Name)
	}
	if env := envName(prefix, f.Name); os.Getenv(env) != "" {
		set = append(set, "environment "+env)
	}
	if s.file != "" && s.v.IsSet(f.Name) {
		set = append(set, "settings file "+s.file)
	}
	if len(set) == 0 {
		return "", nil
	}
	return set[0], set[1:]
}

// fromEnv sets f from its environment variable, when that is set.
func (s *Settings) fromEnv(f *pflag.Flag, prefix string) error {
	env := envName(prefix, f.Name)
	val := os.Getenv(env)
	if f.Changed || val == "" {
		return nil
	}
	if err := set(f, val); err != nil {
		return fmt.Errorf("%s: environment %s: %w", f.Name, env, err)
	}
	return nil
}

// fromFile sets f from the settings file: a scalar, or for a list flag a
// YAML list or a comma-separated string.
func (s *Settings) fromFile(f *pflag.Flag) error {
	var err error
	switch val := s.v.Get(f.Name).(type) {
	case []any:
		sv, ok := f.Value.(pflag.SliceValue)
		if !ok {
			err = errors.New("a list, where one value is expected")
			break
		}
		items := make([]string, len(val))
		for i, item := range val {
			items[i] = fmt.Sprint(item)
		}
		err = sv.Replace(items)
	case map[string]any:
		err = errors.New("a mapping, where a value is expected")
	default:
		err = set(f, fmt.Sprint(val))
	}
	if err != nil {
		return fmt.Errorf("%s: settings file %s: %w", f.Name, s.file, err)
	}
	return nil
}

// set parses val into f as the command line would, with a clearer error.
func set(f *pflag.Flag, val string) error {
	err := f.Value.Set(val)
	if err == nil {
		return nil
	}
	switch f.Value.Type() {
	case "duration":
		return fmt.Errorf("invalid duration %q: a number with a unit, such as 90s, 5m or 1h30m", val)
	case "bool":
		return fmt.Errorf("invalid boolean %q: true or false", val)
	case "int", "int64":
		return fmt.Errorf("invalid integer %q", val)
	case "float64":
		return fmt.Errorf("invalid number %q", val)
	case "bytes":
		return err
	case "string", "stringSlice":
		return err // these may be secrets: never repeat the value
	}
	return fmt.Errorf("invalid value %q: %w", val, err)
}

// readFile reads the settings file that the file flag (or its environment
// variable) names, which must exist, or else src.DefaultFile when it exists.
func (s *Settings) readFile(src Sources) error {
	path := s.fl.Lookup(src.FileFlag).Value.String()
	if path == "" {
		if _, err := os.Stat(src.DefaultFile); src.DefaultFile == "" || errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		path = src.DefaultFile
	}
	s.v.SetConfigFile(path)
	s.v.SetConfigType("yaml")
	if err := s.v.ReadInConfig(); err != nil {
		return fmt.Errorf("reading settings file %q: %w", path, err)
	}
	s.file = path
	return nil
}

// unknownKeys reports every key of the settings file that is neither a flag
// nor a file-only section, in sorted order.
func (s *Settings) unknownKeys(src Sources) []error {
	var errs []error
	seen := make(map[string]bool)
	for _, key := range s.v.AllKeys() {
		top, _, _ := strings.Cut(key, ".")
		if seen[top] {
			continue
		}
		seen[top] = true
		switch {
		case top == src.FileFlag:
			errs = append(errs, fmt.Errorf("settings file %s: key %q: the file is named only by --%s or %s", s.file, top, top, envName(src.EnvPrefix, top)))
		case s.fl.Lookup(top) == nil && !slices.Contains(src.FileOnly, top):
			errs = append(errs, fmt.Errorf("settings file %s: unknown key %q", s.file, top))
		}
	}
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	return errs
}

// Log logs the settings file read and every key set by more than one
// source, with the source that won; never a value.
func (s *Settings) Log(log *slog.Logger) {
	if s.file != "" {
		log.Info("settings file read", "path", s.file)
	}
	for _, o := range s.overrides {
		log.Info("setting overridden", "key", o.key, "from", o.won, "overrides", strings.Join(o.hid, ", "))
	}
}

// File is the settings file read; "" when none was (or s is nil).
func (s *Settings) File() string {
	if s == nil {
		return ""
	}
	return s.file
}

// IsSet reports whether the settings file sets the file-only key.
func (s *Settings) IsSet(key string) bool { return s.file != "" && s.v.IsSet(key) }

// Decode decodes the file-only section key of the settings file into out
// (a pointer to a struct whose field names match the keys, case aside);
// a key that out lacks is an error.
func (s *Settings) Decode(key string, out any) error {
	exact := func(c *mapstructure.DecoderConfig) { c.ErrorUnused = true }
	if err := s.v.UnmarshalKey(key, out, exact); err != nil {
		return fmt.Errorf("%s: settings file %s: %w", key, s.file, err)
	}
	return nil
}

// Given reports whether a source set the flag name: the command line, the
// environment or the settings file; false means its default holds.
func (s *Settings) Given(name string) bool { return s.given[name] }

// String returns the value of the string flag name.
func (s *Settings) String(name string) string { return value(s.fl.GetString, name) }

// Strings returns the value of the string list flag name.
func (s *Settings) Strings(name string) []string { return value(s.fl.GetStringSlice, name) }

// Bool returns the value of the boolean flag name.
func (s *Settings) Bool(name string) bool { return value(s.fl.GetBool, name) }

// Int returns the value of the integer flag name.
func (s *Settings) Int(name string) int { return value(s.fl.GetInt, name) }

// Float64 returns the value of the float flag name.
func (s *Settings) Float64(name string) float64 { return value(s.fl.GetFloat64, name) }

// Duration returns the value of the duration flag name.
func (s *Settings) Duration(name string) time.Duration { return value(s.fl.GetDuration, name) }

// Bytes returns the value of the byte size flag name (see BytesFlag).
func (s *Settings) Bytes(name string) int64 {
	return int64(*s.fl.Lookup(name).Value.(*bytesValue))
}

// value returns get(name), panicking when name is not a flag of get's type:
// a mistake in the program, not in its settings.
func value[T any](get func(string) (T, error), name string) T {
	v, err := get(name)
	if err != nil {
		panic(err)
	}
	return v
}

// BytesFlag defines a byte size flag: a number of bytes, or a whole number
// with a unit, kB, MB, GB or TB (powers of 1000) or KiB, MiB, GiB or TiB
// (powers of 1024), the case of the unit aside: 32MiB is 33554432.
func BytesFlag(fl *pflag.FlagSet, name string, def int64, usage string) {
	v := bytesValue(def)
	fl.Var(&v, name, usage)
}

// bytesValue is a byte size, as a pflag.Value.
type bytesValue int64

var byteUnits = map[string]int64{
	"": 1, "b": 1,
	"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
	"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}

func (b *bytesValue) Set(s string) error {
	i := strings.IndexFunc(s, func(r rune) bool { return r < '0' || r > '9' })
	if i < 0 {
		i = len(s)
	}
	n, err := strconv.ParseInt(s[:i], 10, 64)
	unit, ok := byteUnits[strings.ToLower(strings.TrimSpace(s[i:]))]
	if err != nil || !ok {
		return fmt.Errorf("invalid size %q: bytes, or a whole number with a unit such as 512KiB, 32MiB or 1GB", s)
	}
	if n > (1<<63-1)/unit {
		return fmt.Errorf("size %q is too large", s)
	}
	*b = bytesValue(n * unit)
	return nil
}

// String writes b in the largest of TiB, GiB and MiB that divides it, else
// in bytes.
func (b *bytesValue) String() string {
	n := int64(*b)
	for _, u := range []string{"TiB", "GiB", "MiB"} {
		if size := byteUnits[strings.ToLower(u)]; n != 0 && n%size == 0 {
			return strconv.FormatInt(n/size, 10) + u
		}
	}
	return strconv.FormatInt(n, 10)
}

func (b *bytesValue) Type() string { return "bytes" }
