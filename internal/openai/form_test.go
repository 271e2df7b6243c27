package openai

import (
	"bytes"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// audio is a file whose bytes look like delimiters and headers but for
// the boundary.
var audio = []byte("RIFF\x00\x01\r\n--not-the-boundary\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nevil\r\n\x00\xff")

// form builds a multipart/form-data body of fields (name, value pairs; a
// value for "file" is sent as a file) and returns it with its Content-Type.
func form(t testing.TB, fields ...string) ([]byte, string) {
	t.Helper()
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	for i := 0; i+1 < len(fields); i += 2 {
		var part io.Writer
		var err error
		if fields[i] == "file" {
			part, err = w.CreateFormFile("file", "a.wav")
		} else {
			part, err = w.CreateFormField(fields[i])
		}
		if err != nil {
			t.Fatal(err)
		}
		part.Write([]byte(fields[i+1]))
	}
	w.Close()
	return b.Bytes(), w.FormDataContentType()
}

// formFields reads a form body with the standard library.
func formFields(t *testing.T, body []byte, contentType string) map[string][]string {
	t.Helper()
	_, params, err := mime.ParseMediaType(contentType)
	if err != nil {
		t.Fatal(err)
	}
	f, err := multipart.NewReader(bytes.NewReader(body), params["boundary"]).ReadForm(1 << 20)
	if err != nil {
		t.Fatalf("reading the form: %v", err)
	}
	out := f.Value
	for name, files := range f.File {
		for _, fh := range files {
			r, _ := fh.Open()
			b, _ := io.ReadAll(r)
			out[name] = append(out[name], string(b))
		}
	}
	return out
}

func TestParseForm(t *testing.T) {
	for _, tt := range []struct {
		name                 string
		fields               []string
		model                string
		stream, includeUsage bool
	}{
		{"model then file", []string{"model", "whisper", "file", string(audio)}, "whisper", false, false},
		{"file then model", []string{"file", string(audio), "model", "org/whisper-large"}, "org/whisper-large", false, false},
		{"stream", []string{"file", string(audio), "stream", "true", "model", "w", "stream_include_usage", "1"}, "w", true, true},
		{"stream off", []string{"model", "w", "stream", "False", "file", "x"}, "w", false, false},
		{"other fields", []string{"model", "w", "language", "en", "response_format", "json", "file", ""}, "w", false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			body, ct := form(t, tt.fields...)
			r, err := parseBody(body, ct)
			if err != nil {
				t.Fatal(err)
			}
			if !r.Form || r.Model != tt.model || r.Stream != tt.stream || r.IncludeUsage != tt.includeUsage {
				t.Fatalf("parsed %+v", r)
			}
			if got := string(body[r.modelSpan.from:r.modelSpan.to]); got != tt.model {
				t.Fatalf("model span %q", got)
			}
		})
	}
}

// A form's delimiters may carry a preamble, transport padding and a part
// without headers, as RFC 2046 allows.
func TestParseFormByHand(t *testing.T) {
	body := "preamble\r\n--b  \r\n\r\nno headers\r\n--b\r\ncontent-disposition: form-data; name=model\r\n\r\nm\r\n--b--\r\nepilogue"
	r, err := parseBody([]byte(body), `multipart/form-data; boundary="b"`)
	if err != nil || r.Model != "m" {
		t.Fatalf("parsed %+v, %v", r, err)
	}
}

func TestParseFormErrors(t *testing.T) {
	valid, ct := form(t, "model", "w", "file", string(audio))
	for _, tt := range []struct {
		name, body, contentType, param, want string
	}{
		{"no model", string(must(form(t, "file", "x"))), "", "model", `the form field "model" is required`},
		{"empty model", string(must(form(t, "model", "", "file", "x"))), "", "model", `the form field "model" is required`},
		{"model twice", string(must(form(t, "model", "a", "file", "x", "model", "b"))), "", "model", "appears more than once"},
		{"stream twice", string(must(form(t, "model", "a", "stream", "false", "stream", "true"))), "", "stream", "appears more than once"},
		{"stream_include_usage twice", string(must(form(t, "model", "a", "stream_include_usage", "1", "stream_include_usage", "0"))), "", "stream_include_usage", "appears more than once"},
		{"stream not a boolean", string(must(form(t, "model", "a", "stream", "maybe"))), "", "stream", `"stream" must be a boolean`},
		{"no boundary", string(valid), "multipart/form-data", "", "needs a boundary"},
		{"another boundary", string(valid), "multipart/form-data; boundary=other", "", "without its boundary"},
		{"cut short", string(valid[:len(valid)-10]), ct, "", "does not end with the boundary"},
		{"LF line ends", strings.ReplaceAll(string(valid), "\r\n", "\n"), ct, "", "ends with something else than CRLF"},
		{"headers never end", "--b\r\nContent-Disposition: form-data; name=model", "multipart/form-data; boundary=b", "", "headers do not end"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			contentType := tt.contentType
			if contentType == "" {
				contentType = ct
			}
			if tt.body != string(valid) && tt.contentType == "" {
				// Each form built by form has its own boundary: read it back.
				contentType = "multipart/form-data; boundary=" + strings.TrimPrefix(strings.SplitN(tt.body, "\r\n", 2)[0], "--")
			}
			_, err := parseBody([]byte(tt.body), contentType)
			if err == nil || !errors.Is(err, errBadBody) || !strings.Contains(err.Error(), tt.want) || errParam(err) != tt.param {
				t.Fatalf("error %v (param %q), want %q about %q", err, errParam(err), tt.want, tt.param)
			}
		})
	}
}

func must(b []byte, _ string) []byte { return b }

// An alias in a form is rewritten to the profile's id inside the model
// field; every other byte, the file's included, is kept.
func TestRewriteForm(t *testing.T) {
	body, ct := form(t, "file", string(audio), "model", "whisper", "language", "en")
	r, err := parseBody(body, ct)
	if err != nil {
		t.Fatal(err)
	}
	if out := Rewrite(body, r, Changes{Model: "whisper"}); &out[0] != &body[0] {
		t.Fatal("a form naming the id was copied")
	}
	out := Rewrite(body, r, Changes{Model: "org/whisper-large-v3"})
	if !bytes.Equal(out, bytes.Replace(body, []byte("\r\n\r\nwhisper\r\n"), []byte("\r\n\r\norg/whisper-large-v3\r\n"), 1)) {
		t.Fatalf("rewritten form:\n%q", out)
	}
	got := formFields(t, out, ct)
	if got["model"][0] != "org/whisper-large-v3" || got["file"][0] != string(audio) || got["language"][0] != "en" || len(got) != 3 {
		t.Fatalf("rewritten form's fields: %q", got)
	}
}

// ReadRequest reads a form by its Content-Type, within the body limit.
func TestReadRequestForm(t *testing.T) {
	body, ct := form(t, "model", "w", "file", string(audio))
	req := httptest.NewRequest(http.MethodPost, "/v1/audio/transcriptions", bytes.NewReader(body))
	req.Header.Set("Content-Type", ct)
	got, r, status := ReadRequest(httptest.NewRecorder(), req, 1<<20)
	if status != 0 || r.Model != "w" || !r.Form || !bytes.Equal(got, body) {
		t.Fatalf("status %d, request %+v", status, r)
	}
	req = httptest.NewRequest(http.MethodPost, "/v1/audio/transcriptions", bytes.NewReader(body))
	req.Header.Set("Content-Type", ct)
	rec := httptest.NewRecorder()
	if _, _, status := ReadRequest(rec, req, int64(len(body)-1)); status != http.StatusRequestEntityTooLarge {
		t.Fatalf("a form over the limit: %d %s", status, rec.Body)
	}
}

// Whatever a form body holds, parseForm never panics; a model it reads is
// the bytes of its span, and a form rewritten to another id reads back with
// that id.
func FuzzParseForm(f *testing.F) {
	body, ct := form(f, "model", "w", "file", string(audio), "stream", "true")
	_, params, _ := mime.ParseMediaType(ct)
	f.Add(body, params["boundary"])
	f.Add([]byte("--b\r\n\r\n\r\n--b--"), "b")
	f.Add([]byte("--b\r\nContent-Disposition: form-data; name=model\r\n\r\nm\r\n--b--"), "b")
	f.Fuzz(func(t *testing.T, body []byte, boundary string) {
		r, err := parseForm(body, boundary)
		if err != nil {
			return
		}
		if string(body[r.modelSpan.from:r.modelSpan.to]) != r.Model {
			t.Fatalf("model %q, span %q", r.Model, body[r.modelSpan.from:r.modelSpan.to])
		}
		out := Rewrite(body, r, Changes{Model: "id-" + r.Model})
		r2, err := parseForm(out, boundary)
		if err != nil || r2.Model != "id-"+r.Model {
			t.Fatalf("rewritten form: %+v, %v", r2, err)
		}
	})
}
