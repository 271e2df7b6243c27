package openai

import "testing"

func TestEstimatePromptTokens(t *testing.T) {
	for _, c := range []struct {
		body string
		form bool
		want int
	}{
		{`{}`, false, 1},
		{`{"model":"m"}`, false, 4}, // 13 bytes
		{`{"model":"m","prompt":"abcdefgh"}`, false, 9},
		{"--b\r\nlots of audio bytes", true, 1},
	} {
		if got := EstimatePromptTokens([]byte(c.body), Request{Form: c.form}); got != c.want {
			t.Errorf("EstimatePromptTokens(%q, form %v) = %d, want %d", c.body, c.form, got, c.want)
		}
	}
}
