package profile

// The kinds of model an engine runs (Runner): vLLM serves the routes that
// generate text only for a generative model, and the pooling routes
// (embeddings, score, rerank, classify, pooling) only for a pooling one.
const (
	RunnerGenerate = "generate"
	RunnerPooling  = "pooling"
)

// Runner is the kind of model p's engine runs, as its arguments (Command's
// when it has one, else Args) say: RunnerPooling for --runner pooling, a
// --convert to a pooling model (embed, classify, reward) or an older vLLM's
// pooling --task; RunnerGenerate for --runner generate or --task generate
// or transcription; "" when they say neither (vLLM then tells from the
// model itself, which poold does not read).
func (p *Profile) Runner() string {
	switch p.engineArg("--runner") {
	case "generate":
		return RunnerGenerate
	case "pooling":
		return RunnerPooling
	}
	switch p.engineArg("--convert") {
	case "embed", "classify", "reward":
		return RunnerPooling
	}
	switch p.engineArg("--task") {
	case "generate", "transcription":
		return RunnerGenerate
	case "embed", "embedding", "classify", "score", "reward":
		return RunnerPooling
	}
	return ""
}
