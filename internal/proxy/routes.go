package proxy

import (
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/poold/poold/internal/profile"
)

// inferenceRoutes are the only paths poold forwards to an engine: vLLM's
// inference routes, each as vLLM serves it (some under /v1, some without a
// prefix, rerank under both and /v2). Everything else an engine serves (sleep
// and wake, collective_rpc, cache resets, LoRA loading, its metrics and
// health) is for poold alone.
var inferenceRoutes = map[string]bool{
	"/v1/chat/completions":     true,
	"/v1/completions":          true,
	"/v1/embeddings":           true,
	"/v1/responses":            true,
	"/v1/messages":             true,
	"/v1/audio/transcriptions": true,
	"/v1/audio/translations":   true,
	"/v1/score":                true,
	"/score":                   true,
	"/v1/rerank":               true,
	"/rerank":                  true,
	"/v2/rerank":               true,
	"/classify":                true,
	"/pooling":                 true,
	"/tokenize":                true,
	"/detokenize":              true,
}

// untokened are the inference routes that run no model: their answers carry
// no usage, and a tenant is billed nothing for them.
var untokened = map[string]bool{
	"/tokenize":   true,
	"/detokenize": true,
}

// formRoutes are the inference routes whose body is a multipart/form-data
// form (an audio upload); every other route takes JSON.
var formRoutes = map[string]bool{
	"/v1/audio/transcriptions": true,
	"/v1/audio/translations":   true,
}

// runnerRoutes are the inference routes that only one kind of model serves
// (profile.Runner): vLLM registers the routes that generate text for a
// generative model only, and the pooling routes for a pooling model only.
// The others (tokenize, detokenize) every model serves.
var runnerRoutes = map[string]string{
	"/v1/chat/completions":     profile.RunnerGenerate,
	"/v1/completions":          profile.RunnerGenerate,
	"/v1/responses":            profile.RunnerGenerate,
	"/v1/messages":             profile.RunnerGenerate,
	"/v1/audio/transcriptions": profile.RunnerGenerate,
	"/v1/audio/translations":   profile.RunnerGenerate,
	"/v1/embeddings":           profile.RunnerPooling,
	"/v1/score":                profile.RunnerPooling,
	"/score":                   profile.RunnerPooling,
	"/v1/rerank":               profile.RunnerPooling,
	"/rerank":                  profile.RunnerPooling,
	"/v2/rerank":               profile.RunnerPooling,
	"/classify":                profile.RunnerPooling,
	"/pooling":                 profile.RunnerPooling,
}

// notServed returns, when prof's engine cannot serve path (its arguments
// say it runs the other kind of model), the message of poold's 404
// route_not_served, naming the routes it does serve; "" when it may.
func notServed(prof *profile.Profile, path string) string {
	runner := prof.Runner()
	want, ok := runnerRoutes[path]
	if !ok || runner == "" || runner == want {
		return ""
	}
	var serves []string
	for p := range inferenceRoutes {
		if r, ok := runnerRoutes[p]; !ok || r == runner {
			serves = append(serves, p)
		}
	}
	slices.Sort(serves)
	return fmt.Sprintf("model %s is a %s model (its engine's arguments say so), which does not serve POST %s; it serves POST %s",
		strconv.Quote(prof.ID), runner, path, strings.Join(serves, ", "))
}

// route is where an inference request goes: the engine's path, and the pool
// it pins ("" when any may serve it).
type route struct {
	pool, path string
}

// routeOf reads the route of a request URL: an inference route, optionally
// after /pools/{pool}. The path is decoded once (net/url did it) and must be
// exactly a route, so that dot-segments, doubled or trailing slashes and
// anything else an engine might normalise into another path never match; an
// encoded slash (%2F) is refused outright, since no route has a segment
// containing one.
func routeOf(u *url.URL) (route, bool) {
	if strings.Contains(strings.ToLower(u.RawPath), "%2f") {
		return route{}, false
	}
	var rt route
	p := u.Path
	if rest, ok := strings.CutPrefix(p, "/pools/"); ok {
		i := strings.IndexByte(rest, '/')
		if i <= 0 || rest[:i] == "." || rest[:i] == ".." {
			return route{}, false
		}
		rt.pool, p = rest[:i], rest[i:]
	}
	if !inferenceRoutes[p] {
		return route{}, false
	}
	rt.path = p
	return rt, true
}
