// Package fleet is fleetd: a thin, stateless router in front of many hosts'
// poold daemons. It learns the hosts from a watched JSON file and from DNS,
// polls each host's /status and /v1/models, routes each request to the host
// where its model is cheapest to serve (awake before loading before asleep
// before an idle pool before the shortest queue), and forwards it with
// streaming unbuffered, retrying another host only before any byte reached the
// client. Everything it knows can be rebuilt from the hosts, so several
// replicas can run side by side behind an L4 load balancer.
package fleet

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// DefaultDNSInterval is how often a DNS name is re-resolved when its entry sets
// no interval.
const DefaultDNSInterval = 30 * time.Second

// File is one decoded and validated hosts file:
//
//	{"hosts":  [{"name": "gpu-node-1", "url": "http://10.0.0.11:8080", "labels": {"gpu": "h100"}, "weight": 2}],
//	 "dns":    [{"name": "_poold._tcp.poold.llm.svc.cluster.local", "type": "srv", "interval": "30s"}],
//	 "models": [{"name": "qwen-7b", "minCopies": 1, "maxCopies": 3, "scaleInWindow": "10m"}]}
//
// It is immutable once returned by ParseFile.
type File struct {
	// Hosts are listed by hand.
	Hosts []HostSpec `json:"hosts"`
	// DNS names whose records supply more hosts.
	DNS []DNSSpec `json:"dns"`
	// Models bound the copies scale-out and scale-in keep of some models;
	// the others have the defaults (see ModelSpec).
	Models []ModelSpec `json:"models"`
}

// ModelSpec bounds the copies of one model that fleetd's scale-out and
// scale-in keep awake across the fleet.
type ModelSpec struct {
	// Name is the model as requests name it, or its profile id (a host's
	// "root" for the name).
	Name string `json:"name"`
	// MinCopies is the fewest awake copies scale-in leaves; zero means 1.
	// fleetd loads no copy ahead of demand: below it, nothing is unloaded.
	MinCopies int `json:"minCopies,omitempty"`
	// MaxCopies is the most awake copies scale-out brings the model to;
	// zero means no bound (the hosts that can run it).
	MaxCopies int `json:"maxCopies,omitempty"`
	// ScaleInWindow is a Go duration: how long every awake copy must stay
	// below saturation before fleetd unloads a copy it loaded by scaling
	// out; empty means fleetd's --scale-in-window.
	ScaleInWindow string `json:"scaleInWindow,omitempty"`

	window time.Duration // ScaleInWindow parsed; zero: fleetd's
}

// HostSpec is one poold host.
type HostSpec struct {
	// Name identifies the host in routing decisions, headers, logs and metrics;
	// unique in the fleet.
	Name string `json:"name"`
	// URL is poold's base URL (scheme and host[:port], no path).
	URL string `json:"url"`
	// Labels are free-form and reported by /status; nil means none.
	Labels map[string]string `json:"labels,omitempty"`
	// Weight breaks ties between equally good hosts, higher first; zero means 1.
	Weight int `json:"weight,omitempty"`
}

// DNSSpec is a DNS name whose records are hosts, re-resolved every Interval.
type DNSSpec struct {
	// Name is resolved as is: for "srv" the full record name
	// (_poold._tcp.poold.llm.svc.cluster.local), for "a" a host name.
	Name string `json:"name"`
	// Type is "srv" (targets and ports from SRV records) or "a" (every A and
	// AAAA address, with Port).
	Type string `json:"type"`
	// Port is poold's port for type "a"; it must be zero for "srv".
	Port int `json:"port,omitempty"`
	// Scheme is "http", the only one fleetd speaks to hosts (see noTLS);
	// empty means "http".
	Scheme string `json:"scheme,omitempty"`
	// Interval is a Go duration; empty means DefaultDNSInterval.
	Interval string `json:"interval,omitempty"`
	// Labels and Weight apply to every host found.
	Labels map[string]string `json:"labels,omitempty"`
	Weight int               `json:"weight,omitempty"`

	interval time.Duration // Interval parsed, defaulted
}

// Every returns how often the name is re-resolved.
func (d DNSSpec) Every() time.Duration { return d.interval }

// LoadFile reads and parses the hosts file at path, returning the raw bytes
// too (for the hash /status reports).
func LoadFile(path string) (*File, []byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("reading hosts %q: %w", path, err)
	}
	f, err := ParseFile(data)
	return f, data, err
}

// ParseFile decodes a hosts file strictly (unknown fields, wrong types and
// trailing data are errors) and validates all of it. On failure the error
// joins every problem found, each naming its JSON path, such as
// `hosts[2] "gpu-7": url: scheme "ftp" is neither http nor https`.
func ParseFile(data []byte) (*File, error) {
	var top struct {
		Hosts  []json.RawMessage `json:"hosts"`
		DNS    []json.RawMessage `json:"dns"`
		Models []json.RawMessage `json:"models"`
	}
	if err := strictDecode(data, &top); err != nil {
		return nil, fmt.Errorf("hosts file: %w", err)
	}
	f := &File{}
	var errs, more []error
	f.Hosts, errs = decodeList(top.Hosts, "hosts", func(h HostSpec) string { return h.Name }, true, func(path string, h *HostSpec) []error {
		errs := checkHost(path, *h)
		h.Weight = cmp.Or(h.Weight, 1)
		return errs
	})
	f.DNS, more = decodeList(top.DNS, "dns", func(d DNSSpec) string { return d.Name }, false, checkDNS)
	errs = append(errs, more...)
	f.Models, more = decodeList(top.Models, "models", func(m ModelSpec) string { return m.Name }, true, checkModel)
	errs = append(errs, more...)
	if len(errs) == 0 && len(f.Hosts) == 0 && len(f.DNS) == 0 {
		errs = append(errs, errors.New("hosts file: no hosts and no dns names: fleetd would have nowhere to route"))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return f, nil
}

// strictDecode decodes one JSON value into v, refusing unknown fields and
// anything after the value.
func strictDecode(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return fmt.Errorf("%s: must be a JSON %s, not %s", te.Field, jsonKind(te.Type.Kind().String()), te.Value)
		}
		return err
	}
	if dec.More() {
		return errors.New("unexpected data after the JSON value")
	}
	return nil
}

// jsonKind names a Go kind as the JSON type a user would write.
func jsonKind(kind string) string {
	switch {
	case strings.HasPrefix(kind, "int"), strings.HasPrefix(kind, "uint"), strings.HasPrefix(kind, "float"):
		return "number"
	case kind == "slice":
		return "array"
	case kind == "map", kind == "struct":
		return "object"
	}
	return kind
}

func checkHost(path string, h HostSpec) []error {
	var errs []error
	if msg := nameProblem(h.Name); msg != "" {
		errs = append(errs, fmt.Errorf("%s: name: %s", path, msg))
	}
	if msg := urlProblem(h.URL); msg != "" {
		errs = append(errs, fmt.Errorf("%s: url: %s", path, msg))
	}
	return append(errs, checkCommon(path, h.Labels, h.Weight)...)
}

func checkDNS(path string, d *DNSSpec) []error {
	var errs []error
	if d.Name == "" {
		errs = append(errs, fmt.Errorf("%s: name: required", path))
	}
	switch d.Type {
	case "srv":
		if d.Port != 0 {
			errs = append(errs, fmt.Errorf("%s: port: must be absent for type \"srv\" (SRV records carry the port)", path))
		}
	case "a":
		if d.Port < 1 || d.Port > 65535 {
			errs = append(errs, fmt.Errorf("%s: port: required for type \"a\", between 1 and 65535 (not %d)", path, d.Port))
		}
	case "":
		errs = append(errs, fmt.Errorf("%s: type: required: \"srv\" or \"a\"", path))
	default:
		errs = append(errs, fmt.Errorf("%s: type: %q is neither \"srv\" nor \"a\"", path, d.Type))
	}
	if d.Scheme == "" {
		d.Scheme = "http"
	}
	if d.Scheme != "http" {
		errs = append(errs, fmt.Errorf("%s: scheme: %s", path, schemeProblem(d.Scheme)))
	}
	d.interval = DefaultDNSInterval
	if d.Interval != "" {
		if v, err := seconds(path, "interval", d.Interval); err != nil {
			errs = append(errs, err)
		} else {
			d.interval = v
		}
	}
	if d.Weight == 0 {
		d.Weight = 1
	}
	return append(errs, checkCommon(path, d.Labels, d.Weight)...)
}

// decodeList decodes each entry of the list named list strictly, checks it
// with check (which may complete it), and with unique reports a name used
// twice. It returns the entries decoded and every problem, each naming its
// JSON path: the list's name, the entry's index, and its name when it has
// one.
func decodeList[T any](raws []json.RawMessage, list string, name func(T) string, unique bool, check func(path string, v *T) []error) ([]T, []error) {
	var out []T
	var errs []error
	names := make(map[string]string) // name → path of its first use
	for i, raw := range raws {
		path := fmt.Sprintf("%s[%d]", list, i)
		var v T
		if err := strictDecode(raw, &v); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", path, err))
			continue
		}
		n := name(v)
		if n != "" {
			path += " " + strconv.Quote(n)
		}
		errs = append(errs, check(path, &v)...)
		if first, dup := names[n]; !dup {
			names[n] = path
		} else if unique && n != "" {
			errs = append(errs, fmt.Errorf("%s: name: already used by %s", path, first))
		}
		out = append(out, v)
	}
	return out, errs
}

func checkModel(path string, m *ModelSpec) []error {
	var errs []error
	if m.Name == "" {
		errs = append(errs, fmt.Errorf("%s: name: required", path))
	}
	if m.MinCopies < 0 {
		errs = append(errs, fmt.Errorf("%s: minCopies: must not be negative (zero means 1), not %d", path, m.MinCopies))
	}
	switch {
	case m.MaxCopies < 0:
		errs = append(errs, fmt.Errorf("%s: maxCopies: must not be negative (zero means no bound), not %d", path, m.MaxCopies))
	case m.MaxCopies > 0 && m.MaxCopies < max(m.MinCopies, 1):
		errs = append(errs, fmt.Errorf("%s: maxCopies: %d is below minCopies (%d)", path, m.MaxCopies, max(m.MinCopies, 1)))
	}
	if m.ScaleInWindow != "" {
		var err error
		if m.window, err = seconds(path, "scaleInWindow", m.ScaleInWindow); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// seconds parses field's value s, a Go duration of at least a second.
func seconds(path, field, s string) (time.Duration, error) {
	v, err := time.ParseDuration(s)
	switch {
	case err != nil:
		return 0, fmt.Errorf("%s: %s: invalid duration %q", path, field, s)
	case v < time.Second:
		return 0, fmt.Errorf("%s: %s: %q is shorter than 1s", path, field, s)
	}
	return v, nil
}

func checkCommon(path string, labels map[string]string, weight int) []error {
	var errs []error
	if weight < 0 {
		errs = append(errs, fmt.Errorf("%s: weight: must not be negative (zero means 1), not %d", path, weight))
	}
	if _, ok := labels[""]; ok {
		errs = append(errs, fmt.Errorf("%s: labels: a label name must not be empty", path))
	}
	return errs
}

// nameProblem says why a host name is unusable, or "".
func nameProblem(name string) string {
	if name == "" {
		return "required"
	}
	if len(name) > 128 {
		return "longer than 128 bytes"
	}
	for i := 0; i < len(name); i++ {
		if name[i] <= ' ' || name[i] > '~' {
			return fmt.Sprintf("%q: only printable ASCII without spaces", name)
		}
	}
	return ""
}

// noTLS says why https is refused: fleetd's connections to hosts are plain
// HTTP/1.1 (upstream.Transport), so an https host would stay unreachable
// forever; refusing it when the file loads says so at once.
const noTLS = "fleetd speaks plain HTTP to hosts: secure the network between them (a private network, WireGuard, a mesh sidecar)"

// schemeProblem says why scheme, which is not "http", is unusable.
func schemeProblem(scheme string) string {
	if scheme == "https" {
		return `"https" is not supported: ` + noTLS
	}
	return fmt.Sprintf("%q is not http", scheme)
}

// urlProblem says why a base URL is unusable, or "".
func urlProblem(s string) string {
	if s == "" {
		return "required"
	}
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return fmt.Sprintf("%q does not parse", s)
	case u.Scheme != "http":
		return "scheme " + schemeProblem(u.Scheme)
	case u.Host == "":
		return fmt.Sprintf("%q has no host", s)
	case u.Path != "" && u.Path != "/", u.RawQuery != "", u.Fragment != "", u.User != nil:
		return fmt.Sprintf("%q must be a base URL: scheme and host[:port] only", s)
	}
	return ""
}
