package profile

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Load reads and parses the profiles file at path. It returns the raw bytes as well,
// even when they do not parse, so that the caller can hash exactly what it read.
// Parse errors are returned as Parse returns them, without the path.
func Load(path string) (*Config, []byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("reading profiles %q: %w", path, err)
	}
	c, err := Parse(data)
	return c, data, err
}

// Parse decodes, defaults and validates a profiles file and indexes its names.
//
// Decoding is strict: unknown or duplicate fields, values of the wrong type and
// anything after the top-level object are errors. On failure the error is an
// errors.Join of every problem found, each naming its JSON path (for example
// `profiles[2] "llama-70b": pools[0] "gpu9": no such pool`): the decoding
// problems in document order, then the validation problems of what did decode.
// A value of the wrong type is left out of validation, and so are the problems
// its absence would cause. A file that is not JSON reports only its syntax
// error.
func Parse(data []byte) (*Config, error) {
	var raw json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, syntaxError(data, se)
		}
		return nil, err
	}
	root := buildTree(data)
	var d decodeCheck
	clean := d.value(root, kConfig, "")
	if clean == nil { // the top level is not an object
		return nil, errors.Join(d.errs...)
	}

	c := new(Config)
	dec := json.NewDecoder(bytes.NewReader(clean.appendJSON(nil)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(c); err != nil {
		return nil, err // unreachable: the check keeps only what decodes
	}
	errs := d.errs
	for _, err := range c.validate(root.keys) {
		if !d.causedByDrop(err) {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	c.applyDefaults()
	c.index()
	return c, nil
}

// syntaxError reports se at a line and column (both 1-based, the column in bytes).
func syntaxError(data []byte, se *json.SyntaxError) error {
	pos := int(se.Offset) - 1 // the scanner counts the offending byte
	if se.Offset >= int64(len(data)) && se.Error() == "unexpected end of JSON input" {
		pos = len(data)
	}
	pos = max(0, min(pos, len(data)))
	line, col := 1, 1
	for _, b := range data[:pos] {
		if b == '\n' {
			line, col = line+1, 1
		} else {
			col++
		}
	}
	return fmt.Errorf("syntax error at line %d, column %d: %s", line, col, se.Error())
}

// A node is one JSON value, with object members kept in document order.
type node struct {
	kind byte   // '{', '[', 's' string, 'n' number, 'b' bool, 'z' null
	text string // string contents, number literal, or "true" or "false"
	keys []string
	kids []*node // object member values (parallel to keys) or array elements
}

// buildTree parses data, which must be valid JSON.
func buildTree(data []byte) *node {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return buildNode(dec)
}

func buildNode(dec *json.Decoder) *node {
	tok, _ := dec.Token()
	switch t := tok.(type) {
	case json.Delim:
		n := &node{kind: byte(t)}
		for dec.More() {
			if t == '{' {
				k, _ := dec.Token()
				n.keys = append(n.keys, k.(string))
			}
			n.kids = append(n.kids, buildNode(dec))
		}
		dec.Token() // closing delimiter
		return n
	case string:
		return &node{kind: 's', text: t}
	case json.Number:
		return &node{kind: 'n', text: string(t)}
	case bool:
		return &node{kind: 'b', text: strconv.FormatBool(t)}
	}
	return &node{kind: 'z'}
}

// appendJSON appends n, encoded as JSON, to b.
func (n *node) appendJSON(b []byte) []byte {
	switch n.kind {
	case '{', '[':
		b = append(b, n.kind)
		for i, kid := range n.kids {
			if i > 0 {
				b = append(b, ',')
			}
			if n.kind == '{' {
				b = appendString(b, n.keys[i])
				b = append(b, ':')
			}
			b = kid.appendJSON(b)
		}
		return append(b, n.kind+2) // '{'+2 is '}', '['+2 is ']'
	case 's':
		return appendString(b, n.text)
	case 'n', 'b':
		return append(b, n.text...)
	}
	return append(b, "null"...)
}

func appendString(b []byte, s string) []byte {
	q, _ := json.Marshal(s) // a string always encodes
	return append(b, q...)
}

// member returns the value of the object member key, or nil.
func (n *node) member(key string) *node {
	for i, k := range n.keys {
		if k == key {
			return n.kids[i]
		}
	}
	return nil
}

func (n *node) typeName() string {
	switch n.kind {
	case '{':
		return "object"
	case '[':
		return "array"
	case 's':
		return "string"
	case 'n':
		return "number"
	case 'b':
		return "bool"
	}
	return "null"
}

// A kind is the Go type a JSON value decodes into.
type kind int

const (
	kString kind = iota
	kBool
	kInt
	kDuration
	kStrings
	kInts
	kEnv
	kConfig
	kPools
	kDefaults
	kProfiles
	kSleep
)

var kindNames = [...]string{
	kString:   "string",
	kBool:     "bool",
	kInt:      "int",
	kDuration: "duration",
	kStrings:  "[]string",
	kInts:     "[]int",
	kEnv:      "map[string]string",
	kConfig:   "object",
	kPools:    "array",
	kDefaults: "object",
	kProfiles: "array",
	kSleep:    "object",
}

// jsonKinds is the node kind each kind decodes from.
var jsonKinds = [...]byte{
	kString: 's', kBool: 'b', kInt: 'n', kDuration: 's', kStrings: '[', kInts: '[', kEnv: '{',
	kConfig: '{', kPools: '[', kDefaults: '{', kProfiles: '[', kSleep: '{',
}

type field struct {
	name string
	kind kind
}

// The known fields of each object, as their JSON tags spell them.
var (
	configFields = []field{{"pools", kPools}, {"defaults", kDefaults}, {"profiles", kProfiles}}
	poolFields   = []field{
		{"name", kString}, {"gpus", kInts}, {"default", kString},
		{"minResidency", kDuration}, {"maxQueue", kInt}, {"maxQueueWait", kDuration},
		{"maxSleeping", kInt}, {"allowNonLoopback", kBool},
	}
	defaultsFields = []field{
		{"startupTimeout", kDuration}, {"stopTimeout", kDuration}, {"env", kEnv},
		{"passEnv", kStrings}, {"minResidency", kDuration}, {"maxQueue", kInt},
		{"maxQueueWait", kDuration}, {"sleepMemoryBudget", kInt},
		{"idleTimeout", kDuration}, {"maxKeepAlive", kDuration},
	}
	profileFields = []field{
		{"id", kString}, {"aliases", kStrings}, {"model", kString}, {"pools", kStrings},
		{"maxModelLen", kInt}, {"args", kStrings}, {"env", kEnv}, {"passEnv", kStrings},
		{"command", kStrings},
		{"startupTimeout", kDuration}, {"stopTimeout", kDuration}, {"priority", kInt}, {"maxInFlight", kInt},
		{"minResidency", kDuration}, {"maxQueueWait", kDuration},
		{"sleep", kSleep}, {"weightBytes", kInt},
		{"idleTimeout", kDuration}, {"maxKeepAlive", kDuration},
	}
	sleepFields = []field{{"level", kInt}}
)

// A decodeCheck finds, in document order, every reason a tree would not
// decode into a Config, and builds the tree of what does decode.
type decodeCheck struct {
	errs []error
	// dropped are the paths of the values left out for their type: the zero
	// values left in their place are not reported again by validation.
	dropped []string
}

// fail records the problem at path; drop says that the value is left out.
func (d *decodeCheck) fail(path string, drop bool, format string, args ...any) {
	d.errs = append(d.errs, at(path, format, args...))
	if drop {
		d.dropped = append(d.dropped, path)
	}
}

// causedByDrop reports whether the validation error err is about a value
// left out (`pools[0]`, or `pools[0] ""` as validation names it), or about
// something inside it.
func (d *decodeCheck) causedByDrop(err error) bool {
	msg := err.Error()
	for _, path := range d.dropped {
		if rest, ok := strings.CutPrefix(msg, path); ok && (rest == "" || strings.ContainsRune(":[ ", rune(rest[0]))) {
			return true
		}
	}
	return false
}

// value returns n as it would decode into k, without what would not: nil
// when n itself would not. Exactly what it returns decodes with
// encoding/json, whose case-insensitive field matching and silent duplicate
// handling this check is stricter than. As encoding/json does, null is
// accepted anywhere and leaves the zero value.
func (d *decodeCheck) value(n *node, k kind, path string) *node {
	if n.kind == 'z' {
		return n
	}
	if n.kind != jsonKinds[k] {
		p := path
		if p == "" {
			p = "top level"
		}
		if k == kDuration && n.kind == 'n' {
			d.fail(p, true, "cannot decode number %s into duration: write it as a string with a unit, such as \"%ss\"", n.text, n.text)
			return nil
		}
		d.fail(p, true, "cannot decode %s into %s", n.typeName(), kindNames[k])
		return nil
	}
	switch k {
	case kInt:
		if _, err := strconv.ParseInt(n.text, 10, strconv.IntSize); err != nil {
			d.fail(path, true, "cannot decode number %s into int", n.text)
			return nil
		}
	case kStrings, kInts:
		ek := kString
		if k == kInts {
			ek = kInt
		}
		out := &node{kind: '['}
		for i, e := range n.kids {
			// A null keeps the element's place, so that later paths hold.
			e = cmp.Or(d.value(e, ek, fmt.Sprintf("%s[%d]", path, i)), &node{kind: 'z'})
			out.kids = append(out.kids, e)
		}
		return out
	case kEnv:
		out := &node{kind: '{'}
		for i, key := range n.keys {
			if duplicateKey(n, i) {
				d.fail(path, false, "duplicate key %q", key)
				continue
			}
			if v := d.value(n.kids[i], kString, fmt.Sprintf("%s[%q]", path, key)); v != nil {
				out.keys, out.kids = append(out.keys, key), append(out.kids, v)
			}
		}
		return out
	case kConfig:
		return d.object(n, configFields, path)
	case kDefaults:
		return d.object(n, defaultsFields, path)
	case kSleep:
		return d.object(n, sleepFields, path)
	case kPools, kProfiles:
		section, fields, nameKey := "pools", poolFields, "name"
		if k == kProfiles {
			section, fields, nameKey = "profiles", profileFields, "id"
		}
		out := &node{kind: '['}
		for i, e := range n.kids {
			name := ""
			if e.kind == '{' {
				if v := e.member(nameKey); v != nil && v.kind == 's' {
					name = v.text
				}
			}
			p := elem(section, i, name)
			if e.kind != '{' { // null too: it would decode to a nil element
				d.fail(p, true, "cannot decode %s into object", e.typeName())
				out.kids = append(out.kids, &node{kind: '{'}) // keeps the element's place
				continue
			}
			out.kids = append(out.kids, d.object(e, fields, p))
		}
		return out
	}
	return n
}

// object returns the members of n that are known fields and decode.
func (d *decodeCheck) object(n *node, fields []field, path string) *node {
	out := &node{kind: '{'}
members:
	for i, key := range n.keys {
		if duplicateKey(n, i) {
			d.fail(path, false, "duplicate field %q", key)
			continue
		}
		for _, f := range fields {
			if f.name == key {
				if v := d.value(n.kids[i], f.kind, join(path, key)); v != nil {
					out.keys, out.kids = append(out.keys, key), append(out.kids, v)
				}
				continue members
			}
		}
		d.fail(path, false, "unknown field %q%s", key, suggest(key, fields))
	}
	return out
}

// suggest returns ` (did you mean "name"?)` for the known field nearest to
// an unknown key: one that differs only in case, else one within two edits
// (a swap of neighbours counts as one) of a key at least twice as long as
// that. It returns "" when no field is near enough.
func suggest(key string, fields []field) string {
	best, bestDist := "", 3
	for _, f := range fields {
		if strings.EqualFold(f.name, key) {
			return fmt.Sprintf(" (did you mean %q?)", f.name)
		}
		if dist := editDistance(strings.ToLower(key), strings.ToLower(f.name)); dist < bestDist && 2*dist <= len(key) {
			best, bestDist = f.name, dist
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// editDistance is the optimal string alignment distance between a and b,
// byte-wise: insertions, deletions, substitutions and swaps of neighbours.
func editDistance(a, b string) int {
	// rows i-2, i-1 and i of the table, each len(b)+1 long.
	prev2, prev, cur := make([]int, len(b)+1), make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

// duplicateKey reports whether n.keys[i] appeared earlier in the object.
func duplicateKey(n *node, i int) bool {
	for _, k := range n.keys[:i] {
		if k == n.keys[i] {
			return true
		}
	}
	return false
}

// elem names element i of a top-level array, with its name when it has one:
// `profiles[2] "llama-70b"`.
func elem(section string, i int, name string) string {
	if name == "" {
		return fmt.Sprintf("%s[%d]", section, i)
	}
	return fmt.Sprintf("%s[%d] %q", section, i, name)
}

// join appends a field to a path: `pools[0] "gpu0"` and `gpus` give `pools[0] "gpu0": gpus`.
// An empty field leaves the path as it is.
func join(path, field string) string {
	switch {
	case path == "":
		return field
	case field == "":
		return path
	}
	return path + ": " + field
}

// at returns the error "path: msg", or just msg at the top level.
func at(path, format string, args ...any) error {
	return errors.New(join(path, fmt.Sprintf(format, args...)))
}
