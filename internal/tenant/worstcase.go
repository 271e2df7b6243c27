package tenant

import (
	"cmp"

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
// (openai.EstimatePromptTokens of body, as sent to the engine) plus the
// most it may generate (req.MaxOutput: bound, the one Cap enforces, else
// the largest the request sets, times its sequences), else dflt (the
// model's context length) times its sequences, else DefaultOutputBound
// times them. A route that generates nothing (openai.OutputParams is nil:
// embeddings, scoring, audio) has no output.
func WorstCase(path string, body []byte, req openai.Request, bound *openai.OutputCap, dflt int) int {
	prompt := int64(openai.EstimatePromptTokens(body, req))
	if openai.OutputParams(path) == nil {
		return int(min(prompt, maxWorstCase))
	}
	out, ok := req.MaxOutput(path, bound)
	if !ok {
		out = int64(cmp.Or(max(dflt, 0), DefaultOutputBound)) * max(1, req.Choices)
	}
	return int(min(prompt+min(out, maxWorstCase), maxWorstCase))
}
