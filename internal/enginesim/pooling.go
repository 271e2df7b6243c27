package enginesim

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"net/http"
	"slices"
	"time"
)

// embeddingDim is the length of every simulated embedding.
const embeddingDim = 8

// runPooling runs one pooling request of the prompt ids through the engine
// (the queue, a slot, the time to first token) and answers what result makes.
func (s *Server) runPooling(w http.ResponseWriter, r *http.Request, info *reqInfo, ids []int, result func() any) {
	if len(ids) > s.cfg.MaxModelLen {
		badRequest(w, info, fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens in the input. Please reduce the length of the input.", s.cfg.MaxModelLen, len(ids)))
		return
	}
	q, ok := s.admit(w, r, info, ids)
	if !ok {
		return
	}
	defer q.done()
	var sl sleeper
	defer sl.stop()
	if !sl.sleep(q.r.Context().Done(), s.cfg.TTFT) {
		switch cause := context.Cause(q.r.Context()); {
		case errors.Is(cause, errCoreDead):
			q.finish = ""
			s.failDead(w, info)
		case isAbort(cause):
			writeError(w, info, http.StatusInternalServerError, "InternalServerError", "", cause.Error())
		default:
			info.status = 499
		}
		return
	}
	s.metrics.ttft.Observe(time.Since(q.start).Seconds())
	q.finish = "stop"
	b, _ := json.Marshal(result())
	s.writeResult(w, b)
}

// poolingUsage is the usage of a pooling request of n prompt tokens.
func poolingUsage(n int) usageInfo { return usageInfo{PromptTokens: n, TotalTokens: n} }

type embeddingRequest struct {
	Model          *string         `json:"model"`
	Input          json.RawMessage `json:"input"`
	EncodingFormat *string         `json:"encoding_format"`
}

type embeddingData struct {
	Index     int    `json:"index"`
	Object    string `json:"object"`
	Embedding any    `json:"embedding"`
}

type listResponse[T any] struct {
	ID      string    `json:"id"`
	Object  string    `json:"object"`
	Created int64     `json:"created"`
	Model   string    `json:"model"`
	Data    []T       `json:"data"`
	Usage   usageInfo `json:"usage"`
}

// readInput reads a request with a model and an input (embeddings, pooling,
// classify), or answers 400 or 404 and returns ok false.
func (s *Server) readInput(w http.ResponseWriter, r *http.Request, info *reqInfo) (req embeddingRequest, in input, ok bool) {
	if !readBody(w, r, info, &req) {
		return req, in, false
	}
	if req.Input == nil {
		badRequest(w, info, "Field required: input")
		return req, in, false
	}
	in, err := parseInput(req.Input)
	if err != nil {
		badRequest(w, info, fmt.Sprintf("input: %v", err))
		return req, in, false
	}
	return req, in, s.resolveModel(w, info, req.Model)
}

// poolEach runs a pooling request and answers a list with one datum per
// input item.
func poolEach[T any](s *Server, w http.ResponseWriter, r *http.Request, info *reqInfo, in input, idPrefix string, datum func(i int, item []int) T) {
	ids := in.all()
	s.runPooling(w, r, info, ids, func() any {
		resp := listResponse[T]{ID: idPrefix + info.id, Object: "list", Created: time.Now().Unix(), Model: s.model, Usage: poolingUsage(len(ids))}
		for i, item := range in.items {
			resp.Data = append(resp.Data, datum(i, item))
		}
		return resp
	})
}

func (s *Server) handleEmbeddings(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	req, in, ok := s.readInput(w, r, info)
	if !ok {
		return
	}
	b64 := false
	if req.EncodingFormat != nil {
		switch *req.EncodingFormat {
		case "float":
		case "base64":
			b64 = true
		default:
			badRequest(w, info, fmt.Sprintf("encoding_format: unsupported value %q (use float or base64)", *req.EncodingFormat))
			return
		}
	}
	poolEach(s, w, r, info, in, "embd-", func(i int, item []int) embeddingData {
		vec := vector(item, i)
		d := embeddingData{Index: i, Object: "embedding", Embedding: vec}
		if b64 {
			raw := make([]byte, 4*len(vec))
			for j, f := range vec {
				binary.LittleEndian.PutUint32(raw[4*j:], math.Float32bits(f))
			}
			d.Embedding = base64.StdEncoding.EncodeToString(raw)
		}
		return d
	})
}

type poolingData struct {
	Index  int       `json:"index"`
	Object string    `json:"object"`
	Data   []float32 `json:"data"`
}

// handlePooling serves /pooling: the model's raw pooled output per input.
func (s *Server) handlePooling(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	if _, in, ok := s.readInput(w, r, info); ok {
		poolEach(s, w, r, info, in, "pool-", func(i int, item []int) poolingData {
			return poolingData{Index: i, Object: "pooling", Data: vector(item, i)}
		})
	}
}

type classifyData struct {
	Index      int       `json:"index"`
	Label      string    `json:"label"`
	Probs      []float64 `json:"probs"`
	NumClasses int       `json:"num_classes"`
}

// handleClassify serves /classify: two classes, LABEL_0 and LABEL_1.
func (s *Server) handleClassify(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	if _, in, ok := s.readInput(w, r, info); ok {
		poolEach(s, w, r, info, in, "classify-", func(i int, item []int) classifyData {
			p := score(item, nil)
			label := "LABEL_0"
			if p < 0.5 {
				label = "LABEL_1"
			}
			return classifyData{Index: i, Label: label, Probs: []float64{p, 1 - p}, NumClasses: 2}
		})
	}
}

type scoreRequest struct {
	Model *string         `json:"model"`
	Text1 json.RawMessage `json:"text_1"`
	Text2 json.RawMessage `json:"text_2"`
}

type scoreData struct {
	Index  int     `json:"index"`
	Object string  `json:"object"`
	Score  float64 `json:"score"`
}

// handleScore serves /score and /v1/score: text_1 (one text, or a list as
// long as text_2) scored against each text of text_2.
func (s *Server) handleScore(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	var req scoreRequest
	if !readBody(w, r, info, &req) {
		return
	}
	left, err1 := parseInput(req.Text1)
	right, err2 := parseInput(req.Text2)
	switch {
	case err1 != nil:
		badRequest(w, info, fmt.Sprintf("text_1: %v", err1))
		return
	case err2 != nil:
		badRequest(w, info, fmt.Sprintf("text_2: %v", err2))
		return
	case len(left.items) != 1 && len(left.items) != len(right.items):
		badRequest(w, info, "text_1 must be one text or as many texts as text_2")
		return
	}
	if !s.resolveModel(w, info, req.Model) {
		return
	}
	var ids []int
	pairs := make([][2][]int, len(right.items))
	for i, b := range right.items {
		a := left.items[min(i, len(left.items)-1)]
		pairs[i] = [2][]int{a, b}
		ids = append(append(ids, a...), b...)
	}
	s.runPooling(w, r, info, ids, func() any {
		resp := listResponse[scoreData]{ID: "score-" + info.id, Object: "list", Created: time.Now().Unix(), Model: s.model, Usage: poolingUsage(len(ids))}
		for i, pr := range pairs {
			resp.Data = append(resp.Data, scoreData{Index: i, Object: "score", Score: score(pr[0], pr[1])})
		}
		return resp
	})
}

type rerankRequest struct {
	Model     *string  `json:"model"`
	Query     *string  `json:"query"`
	Documents []string `json:"documents"`
	TopN      *int     `json:"top_n"`
}

type rerankResult struct {
	Index          int               `json:"index"`
	Document       map[string]string `json:"document"`
	RelevanceScore float64           `json:"relevance_score"`
}

type rerankResponse struct {
	ID      string         `json:"id"`
	Model   string         `json:"model"`
	Usage   map[string]int `json:"usage"`
	Results []rerankResult `json:"results"`
}

// handleRerank serves /rerank and /v1/rerank: documents by relevance to the
// query, best first, the top_n of them.
func (s *Server) handleRerank(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	var req rerankRequest
	if !readBody(w, r, info, &req) {
		return
	}
	if req.Query == nil || req.Documents == nil {
		badRequest(w, info, "Field required: query and documents")
		return
	}
	if !s.resolveModel(w, info, req.Model) {
		return
	}
	query := tokenize(*req.Query)
	ids := slices.Clone(query)
	for _, d := range req.Documents {
		ids = append(ids, tokenize(d)...)
	}
	s.runPooling(w, r, info, ids, func() any {
		resp := rerankResponse{ID: "rerank-" + info.id, Model: s.model, Usage: map[string]int{"total_tokens": len(ids)}, Results: []rerankResult{}}
		for i, d := range req.Documents {
			resp.Results = append(resp.Results, rerankResult{Index: i, Document: map[string]string{"text": d}, RelevanceScore: score(query, tokenize(d))})
		}
		slices.SortStableFunc(resp.Results, func(a, b rerankResult) int { return cmp.Compare(b.RelevanceScore, a.RelevanceScore) })
		if req.TopN != nil && *req.TopN > 0 && *req.TopN < len(resp.Results) {
			resp.Results = resp.Results[:*req.TopN]
		}
		return resp
	})
}

type tokenizeRequest struct {
	Model          *string         `json:"model"`
	Prompt         json.RawMessage `json:"prompt"`
	Messages       *[]chatMessage  `json:"messages"`
	ReturnTokenStr *bool           `json:"return_token_strs"`
}

// handleTokenize serves /tokenize for a prompt or chat messages. The API
// server tokenizes by itself: it answers while the engine sleeps.
func (s *Server) handleTokenize(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	var req tokenizeRequest
	if !readBody(w, r, info, &req) {
		return
	}
	var ids []int
	switch {
	case req.Messages != nil:
		for i, m := range *req.Messages {
			t, err := contentText(m.Content)
			if err != nil {
				badRequest(w, info, fmt.Sprintf("messages[%d].content: %v", i, err))
				return
			}
			ids = append(ids, tokenize(t)...)
		}
	case req.Prompt != nil:
		in, err := parseInput(req.Prompt)
		if err != nil {
			badRequest(w, info, fmt.Sprintf("prompt: %v", err))
			return
		}
		ids = in.all()
	default:
		badRequest(w, info, "Field required: prompt or messages")
		return
	}
	if !s.resolveModel(w, info, req.Model) {
		return
	}
	resp := struct {
		Count       int      `json:"count"`
		MaxModelLen int      `json:"max_model_len"`
		Tokens      []int    `json:"tokens"`
		TokenStrs   []string `json:"token_strs"`
	}{len(ids), s.cfg.MaxModelLen, ids, nil}
	if resp.Tokens == nil {
		resp.Tokens = []int{}
	}
	if req.ReturnTokenStr != nil && *req.ReturnTokenStr {
		for _, id := range ids {
			resp.TokenStrs = append(resp.TokenStrs, detokenize([]int{id}))
		}
	}
	b, _ := json.Marshal(resp)
	writeJSON(w, http.StatusOK, b)
}

// handleDetokenize serves /detokenize.
func (s *Server) handleDetokenize(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	var req struct {
		Model  *string `json:"model"`
		Tokens []int   `json:"tokens"`
	}
	if !readBody(w, r, info, &req) {
		return
	}
	if req.Tokens == nil {
		badRequest(w, info, "Field required: tokens")
		return
	}
	if !s.resolveModel(w, info, req.Model) {
		return
	}
	b, _ := json.Marshal(map[string]string{"prompt": detokenize(req.Tokens)})
	writeJSON(w, http.StatusOK, b)
}

// vector returns a deterministic unit vector for input item i.
func vector(ids []int, i int) []float32 {
	seed := hashIDs(ids, uint64(i))
	vec := make([]float32, embeddingDim)
	var norm float64
	for j := range vec {
		seed = seed*6364136223846793005 + 1442695040888963407
		v := float64(int32(seed>>32)) / math.MaxInt32
		vec[j] = float32(v)
		norm += v * v
	}
	if norm == 0 {
		vec[0], norm = 1, 1
	}
	for j := range vec {
		vec[j] = float32(float64(vec[j]) / math.Sqrt(norm))
	}
	return vec
}

// score returns a deterministic score in [0, 1) for a pair of inputs.
func score(a, b []int) float64 {
	return float64(hashIDs(append(slices.Clone(a), b...), uint64(len(a)))%10000) / 10000
}

func hashIDs(ids []int, salt uint64) uint64 {
	h := fnv.New64a()
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], salt)
	_, _ = h.Write(buf[:])
	for _, id := range ids {
		binary.LittleEndian.PutUint64(buf[:], uint64(id))
		_, _ = h.Write(buf[:])
	}
	return h.Sum64()
}
