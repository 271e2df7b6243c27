package profile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
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
// errors.Join of every problem found, in document order, each naming its JSON path
// (for example `profiles[2] "llama-70b": pools[0] "gpu9": no such pool`). A file
// that does not decode reports only its decoding errors.
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
	var errs []error
	checkValue(root, kConfig, "", &errs)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}

	c := new(Config)
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(c); err != nil {
		return nil, err // unreachable: the tree check accepts only what decodes
	}
	if errs := c.validate(root.keys); len(errs) > 0 {
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
	text string // string contents or number literal
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
		return &node{kind: 'b'}
	}
	return &node{kind: 'z'}
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
	}
	profileFields = []field{
		{"id", kString}, {"aliases", kStrings}, {"model", kString}, {"pools", kStrings},
		{"maxModelLen", kInt}, {"args", kStrings}, {"env", kEnv}, {"passEnv", kStrings},
		{"command", kStrings},
		{"startupTimeout", kDuration}, {"stopTimeout", kDuration}, {"priority", kInt},
		{"minResidency", kDuration}, {"maxQueueWait", kDuration},
		{"sleep", kSleep}, {"weightBytes", kInt},
	}
	sleepFields = []field{{"level", kInt}}
)

// checkValue appends to errs, in document order, every reason n would not decode
// into k. Exactly what passes decodes with encoding/json, whose case-insensitive
// field matching and silent duplicate handling this check is stricter than. As
// encoding/json does, null is accepted anywhere and leaves the zero value.
func checkValue(n *node, k kind, path string, errs *[]error) {
	if n.kind == 'z' {
		return
	}
	if n.kind != jsonKinds[k] {
		p := path
		if p == "" {
			p = "top level"
		}
		*errs = append(*errs, at(p, "cannot decode %s into %s", n.typeName(), kindNames[k]))
		return
	}
	switch k {
	case kInt:
		if _, err := strconv.ParseInt(n.text, 10, strconv.IntSize); err != nil {
			*errs = append(*errs, at(path, "cannot decode number %s into int", n.text))
		}
	case kStrings, kInts:
		ek := kString
		if k == kInts {
			ek = kInt
		}
		for i, e := range n.kids {
			checkValue(e, ek, fmt.Sprintf("%s[%d]", path, i), errs)
		}
	case kEnv:
		for i, key := range n.keys {
			if duplicateKey(n, i) {
				*errs = append(*errs, at(path, "duplicate key %q", key))
			}
			checkValue(n.kids[i], kString, fmt.Sprintf("%s[%q]", path, key), errs)
		}
	case kConfig:
		checkObject(n, configFields, path, errs)
	case kDefaults:
		checkObject(n, defaultsFields, path, errs)
	case kSleep:
		checkObject(n, sleepFields, path, errs)
	case kPools, kProfiles:
		section, fields, nameKey := "pools", poolFields, "name"
		if k == kProfiles {
			section, fields, nameKey = "profiles", profileFields, "id"
		}
		for i, e := range n.kids {
			name := ""
			if e.kind == '{' {
				if v := e.member(nameKey); v != nil && v.kind == 's' {
					name = v.text
				}
			}
			p := elem(section, i, name)
			if e.kind != '{' { // null too: it would decode to a nil element
				*errs = append(*errs, at(p, "cannot decode %s into object", e.typeName()))
				continue
			}
			checkObject(e, fields, p, errs)
		}
	}
}

func checkObject(n *node, fields []field, path string, errs *[]error) {
members:
	for i, key := range n.keys {
		if duplicateKey(n, i) {
			*errs = append(*errs, at(path, "duplicate field %q", key))
			continue
		}
		for _, f := range fields {
			if f.name == key {
				checkValue(n.kids[i], f.kind, join(path, key), errs)
				continue members
			}
		}
		*errs = append(*errs, at(path, "unknown field %q", key))
	}
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
