package enginesim

import (
	"container/list"
	"encoding/binary"
	"encoding/json"
	"errors"
	"hash/fnv"
	"strconv"
	"strings"
)

// The simulator's tokenizer: a token is a whitespace-separated word, and its
// id a hash of the word in a vocabulary of vocabSize. Generated tokens are
// "tok0 ", "tok1 ", …
const vocabSize = 151936

// tokenID is the id of one word.
func tokenID(word string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(word))
	return int(h.Sum32() % vocabSize)
}

// tokenize returns the ids of the words of text.
func tokenize(text string) []int {
	words := strings.Fields(text)
	ids := make([]int, len(words))
	for i, w := range words {
		ids[i] = tokenID(w)
	}
	return ids
}

// detokenize renders ids as text; the simulator's ids do not map back to
// words, so id n reads "w<n>".
func detokenize(ids []int) string {
	var b strings.Builder
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteByte('w')
		b.WriteString(strconv.Itoa(id))
	}
	return b.String()
}

// appendToken appends the deterministic text of generated token i: "tok<i> ".
func appendToken(b []byte, i int) []byte {
	b = append(b, "tok"...)
	b = strconv.AppendInt(b, int64(i), 10)
	return append(b, ' ')
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type contentPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// contentText is the text of a chat message content: a string, null, or an
// array of parts whose "text" parts count (and the Responses API's
// "input_text" and "output_text").
func contentText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	switch raw[0] {
	case '"':
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	case '[':
		var parts []contentPart
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", err
		}
		var b strings.Builder
		for _, p := range parts {
			if p.Type == "text" || p.Type == "input_text" || p.Type == "output_text" {
				b.WriteString(p.Text)
				b.WriteByte('\n')
			}
		}
		return b.String(), nil
	}
	return "", errors.New("content must be a string or an array of content parts")
}

// input is a prompt or an embeddings input: a string, an array of strings, an
// array of token ids or an array of arrays of token ids.
type input struct {
	items [][]int  // the token ids of each separate input
	texts []string // the text of each, "" for token ids
}

func parseInput(raw json.RawMessage) (input, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return input{}, errors.New("missing")
	}
	var in input
	var str string
	if json.Unmarshal(raw, &str) == nil {
		return input{items: [][]int{tokenize(str)}, texts: []string{str}}, nil
	}
	var strs []string
	if json.Unmarshal(raw, &strs) == nil {
		for _, s := range strs {
			in.items = append(in.items, tokenize(s))
		}
		in.texts = strs
		return in, nil
	}
	var ids []int
	if json.Unmarshal(raw, &ids) == nil {
		return input{items: [][]int{ids}, texts: []string{""}}, nil
	}
	if json.Unmarshal(raw, &in.items) == nil {
		in.texts = make([]string, len(in.items))
		return in, nil
	}
	return input{}, errors.New("must be a string, an array of strings, an array of token ids or an array of arrays of token ids")
}

// all is every token id of the input, in order.
func (in input) all() []int {
	var ids []int
	for _, it := range in.items {
		ids = append(ids, it...)
	}
	return ids
}

// prefixBlock is the prefix cache's block size in tokens (vLLM's default).
const prefixBlock = 16

// prefixCache simulates vLLM's automatic prefix caching: prompts are cut
// into blocks of prefixBlock tokens, each named by a hash of its tokens and
// of the blocks before it; a prompt hits the leading blocks already cached.
// The least recently used blocks go first once it holds limit. Server.mu
// guards it.
type prefixCache struct {
	limit  int
	blocks map[uint64]*list.Element
	lru    *list.List // of uint64 block hashes, most recent first
}

func newPrefixCache(limit int) *prefixCache {
	return &prefixCache{limit: max(limit, 1), blocks: make(map[uint64]*list.Element), lru: list.New()}
}

// lookup returns how many of ids' tokens were cached and caches all its
// full blocks.
func (c *prefixCache) lookup(ids []int) (hit int) {
	var h uint64
	var buf [8 * (prefixBlock + 1)]byte // the previous block's hash, then the block's ids
	leading := true
	for end := prefixBlock; end <= len(ids); end += prefixBlock {
		binary.LittleEndian.PutUint64(buf[:], h)
		for i, id := range ids[end-prefixBlock : end] {
			binary.LittleEndian.PutUint64(buf[8*(i+1):], uint64(id))
		}
		f := fnv.New64a()
		_, _ = f.Write(buf[:])
		h = f.Sum64()
		if e, ok := c.blocks[h]; ok {
			if leading {
				hit += prefixBlock
			}
			c.lru.MoveToFront(e)
			continue
		}
		leading = false
		c.blocks[h] = c.lru.PushFront(h)
		for c.lru.Len() > c.limit {
			old := c.lru.Back()
			delete(c.blocks, old.Value.(uint64))
			c.lru.Remove(old)
		}
	}
	return hit
}

// reset empties the cache, as /reset_prefix_cache and a sleep do.
func (c *prefixCache) reset() {
	clear(c.blocks)
	c.lru.Init()
}
