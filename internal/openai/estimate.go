package openai

// bytesPerToken is the bytes of a JSON request body that poold counts as
// one prompt token when it must estimate: vLLM's tokenizers average about
// four bytes of English text per token, and a body's JSON punctuation and
// keys make the estimate err high, which is the side a reservation wants.
const bytesPerToken = 4

// EstimatePromptTokens is poold's estimate of the prompt tokens of a request
// body, from its size: one token per bytesPerToken bytes, at least 1. A
// form (an audio upload) is estimated at 1: its bytes are audio, not text,
// and an audio prompt's tokens are known only from the engine's usage.
func EstimatePromptTokens(body []byte, r Request) int {
	if r.Form {
		return 1
	}
	return max(1, (len(body)+bytesPerToken-1)/bytesPerToken)
}
