package tenant

import (
	"strconv"

	"github.com/poold/poold/internal/openai"
)

// DefaultOutputBound is the output tokens WorstCase counts for a request
// that sets no bound when the daemon knows no better one (no output cap,
// no context length of the model).
const DefaultOutputBound = 4096

// maxWorstCase bounds a worst case, so that an absurd bound times an absurd
// n cannot overflow: it is still far above any limit, so such a request is
// taken only from a full bucket.
const maxWorstCase = 1 << 30

// WorstCase is the most tokens a request for the inference route path may
// use, as Reserve takes it: the estimate of its prompt
// (openai.EstimatePromptTokens of body, as sent to the engine) plus its
// output bound times its choices. The output bound is the largest that the
// request sets (req.OutputCaps), else dflt (the tenant's output cap, which
// Cap inserted, or the model's context length), else DefaultOutputBound; its
// choices are the larger of n and best_of, at least 1. A route that
// generates nothing (openai.OutputParams is nil: embeddings, scoring,
// audio) has no output bound.
func WorstCase(path string, body []byte, req openai.Request, dflt int) int {
	prompt := int64(openai.EstimatePromptTokens(body, req))
	if openai.OutputParams(path) == nil {
		return int(min(prompt, maxWorstCase))
	}
	bound := int64(-1)
	for _, c := range req.OutputCaps {
		bound = max(bound, c.N)
	}
	switch {
	case bound >= 0:
	case dflt > 0:
		bound = int64(dflt)
	default:
		bound = DefaultOutputBound
	}
	choices := max(1, count(openai.Member(body, "n")), count(openai.Member(body, "best_of")))
	return int(min(prompt+min(bound, maxWorstCase)*choices, maxWorstCase))
}

// count reads a JSON integer (or a string holding one, as vLLM reads it);
// 0 when raw is absent or is not a positive integer, and at most
// maxWorstCase.
func count(raw []byte) int64 {
	if len(raw) >= 2 && raw[0] == '"' {
		raw = raw[1 : len(raw)-1]
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return min(n, maxWorstCase)
}
