package main

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"

	"github.com/poold/poold/internal/proxy"
)

// defaultSettingsFile is read when it exists and no --config is given.
const defaultSettingsFile = "/etc/poold/poold.yaml"

// settings are the daemon's own settings (the profiles file says what to serve).
// Precedence, highest first: flags, POOLD_* environment variables, the settings
// file, defaults.
type settings struct {
	Listen          string
	Profiles        string
	LogLevel        slog.Level
	LogFormat       string
	MaxBodyBytes    int64
	ShutdownTimeout time.Duration
}

// loadSettings parses serve's flags and merges them with the environment and
// the optional settings file.
func loadSettings(args []string) (settings, error) {
	fl := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	fl.String("config", "", "settings file (YAML); default "+defaultSettingsFile+" when it exists")
	fl.String("listen", "127.0.0.1:8080", "address to serve the API on")
	fl.String("profiles", "", "profiles JSON file (required)")
	fl.String("log-level", "info", "log level: debug, info, warn or error")
	fl.String("log-format", "text", "log format: json or text")
	fl.Int64("max-body-bytes", proxy.DefaultMaxBodyBytes, "request body limit in bytes")
	fl.Duration("shutdown-timeout", 2*time.Minute, "how long in-flight requests may run on after SIGTERM before they are cut")
	if err := fl.Parse(args); err != nil {
		return settings{}, err
	}
	if fl.NArg() > 0 {
		return settings{}, fmt.Errorf("unexpected arguments: %s", strings.Join(fl.Args(), " "))
	}
	v := viper.New()
	v.SetEnvPrefix("POOLD")
	v.SetEnvKeyReplacer(strings.NewReplacer("-", "_"))
	v.AutomaticEnv()
	if err := v.BindPFlags(fl); err != nil {
		return settings{}, err
	}
	if err := readSettingsFile(v); err != nil {
		return settings{}, err
	}

	var s settings
	s.Listen = v.GetString("listen")
	s.Profiles = v.GetString("profiles")
	s.LogFormat = v.GetString("log-format")
	s.MaxBodyBytes = v.GetInt64("max-body-bytes")
	s.ShutdownTimeout = v.GetDuration("shutdown-timeout")
	var errs []error
	if err := s.LogLevel.UnmarshalText([]byte(v.GetString("log-level"))); err != nil {
		errs = append(errs, fmt.Errorf("log-level: %w", err))
	}
	if s.LogFormat != "json" && s.LogFormat != "text" {
		errs = append(errs, fmt.Errorf("log-format: %q is neither json nor text", s.LogFormat))
	}
	if s.Profiles == "" {
		errs = append(errs, errors.New("profiles: a profiles file is required (--profiles or POOLD_PROFILES)"))
	}
	if s.MaxBodyBytes <= 0 {
		errs = append(errs, fmt.Errorf("max-body-bytes: must be positive, not %d", s.MaxBodyBytes))
	}
	if s.ShutdownTimeout < 0 {
		errs = append(errs, fmt.Errorf("shutdown-timeout: must not be negative"))
	}
	return s, errors.Join(errs...)
}

// readSettingsFile reads --config (or POOLD_CONFIG), which must exist, or else
// the default file when it exists.
func readSettingsFile(v *viper.Viper) error {
	path := v.GetString("config")
	if path == "" {
		if _, err := os.Stat(defaultSettingsFile); errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		path = defaultSettingsFile
	}
	v.SetConfigFile(path)
	if err := v.ReadInConfig(); err != nil {
		return fmt.Errorf("reading settings %q: %w", path, err)
	}
	return nil
}

// newLogger builds the daemon's logger on stderr.
func newLogger(s settings) *slog.Logger {
	opts := &slog.HandlerOptions{Level: s.LogLevel}
	if s.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}
