package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// helperEngineEnv, in an engine's environment, makes this test binary run as
// that engine (runHelperEngine) instead of running tests: a stand-in for
// engine behaviour that the simulator does not have.
const helperEngineEnv = "POOLD_E2E_ENGINE"

// helperSim is a profile whose engine is this test binary in mode, with
// mode's own arguments after the port and the model id.
func helperSim(tag, id, mode string, args ...string) sim {
	exe, err := os.Executable()
	if err != nil {
		panic(err)
	}
	return sim{ID: id, Extra: map[string]any{
		"command": append([]string{exe, "{port}", "{id}"}, args...),
		"env":     map[string]string{"POOLD_E2E_TAG": runTag(tag), helperEngineEnv: mode},
	}}
}

// runHelperEngine serves an OpenAI-compatible engine on 127.0.0.1:args[0]
// listing model args[1], until it is killed. Its modes:
//
//   - "big-headers": a POST is answered with 2 MiB of response headers;
//   - "early-413": a POST is answered 413 at once, its body unread, and the
//     connection closed;
//   - "drop-second": every POST is logged ("received BODY") and answered,
//     but the second on each connection, which is read whole and then
//     dropped unanswered with its connection;
//   - "log-body": every POST is logged ("received BODY") and answered;
//   - "reuseport" FILE: waits (at most a minute) for FILE to exist, then
//     listens with SO_REUSEPORT;
//   - "slow-tail": a POST is answered with a completion whose first 64 KiB
//     (the headers with them) leave at once and whose rest, its usage of 7
//     prompt and 900 completion tokens among it, a second later;
//   - "stream-no-usage": a POST is answered with a chat stream of three
//     chunks of text and no usage, whatever the request asked for;
//   - "big-plain": a POST is answered with a chat completion of 16 MiB,
//     its usage at the end;
//   - "drip": a POST is answered with an event stream that sends a byte
//     every 100 ms and never completes an event, until the client leaves
//     (ten minutes at most);
//   - "flood-die" FILE: once FILE exists, removes it (the next engine
//     serves on), prints 64 Ki lines of 200 bytes, far beyond what a
//     shim queues and a socket holds, and exits 3;
//
// and otherwise a POST is answered {"served_by":"engine"}.
func runHelperEngine(mode string, args []string) int {
	if len(args) < 2 {
		fmt.Fprintln(os.Stderr, "helper engine: want PORT MODEL [ARGS]")
		return 2
	}
	port, model := args[0], args[1]
	var lc net.ListenConfig
	if mode == "reuseport" {
		if len(args) < 3 {
			fmt.Fprintln(os.Stderr, "helper engine: reuseport wants a FILE")
			return 2
		}
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(5 * time.Millisecond) {
			if _, err := os.Stat(args[2]); err == nil {
				break
			}
			if time.Now().After(deadline) {
				fmt.Fprintln(os.Stderr, "helper engine: no", args[2])
				return 1
			}
		}
		lc.Control = reusePort
	}
	if mode == "flood-die" {
		if len(args) < 3 {
			fmt.Fprintln(os.Stderr, "helper engine: flood-die wants a FILE")
			return 2
		}
		go floodDie(args[2])
	}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:"+port)
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper engine:", err)
		return 1
	}
	fmt.Fprintln(os.Stderr, "helper engine ready:", mode, ln.Addr())
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		modelList(w, model)
	})
	mux.HandleFunc("POST /", func(w http.ResponseWriter, r *http.Request) {
		switch mode {
		case "big-headers":
			for i := range 2048 {
				w.Header().Set("X-Filler-"+strconv.Itoa(i), strings.Repeat("f", 1024))
			}
			w.WriteHeader(http.StatusOK)
		case "drop-second":
			b, _ := io.ReadAll(r.Body)
			fmt.Fprintf(os.Stderr, "received %s\n", b)
			n := r.Context().Value(connRequests{}).(*int)
			if *n++; *n == 2 {
				if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
					c.Close()
				}
				return
			}
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"served_by":"engine"}`)
		case "log-body":
			b, _ := io.ReadAll(r.Body)
			fmt.Fprintf(os.Stderr, "received %s\n", b)
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"served_by":"engine"}`)
		case "slow-tail":
			head := `{"id":"cmpl-1","object":"text_completion","model":"` + model + `","choices":[{"index":0,"text":"` + strings.Repeat("t", 64<<10)
			rest := `","finish_reason":"length"}],"usage":{"prompt_tokens":7,"total_tokens":907,"completion_tokens":900}}`
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", strconv.Itoa(len(head)+len(rest)))
			fmt.Fprint(w, head)
			http.NewResponseController(w).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(time.Second):
			}
			fmt.Fprint(w, rest)
		case "stream-no-usage":
			w.Header().Set("Content-Type", "text/event-stream")
			for _, text := range []string{"one", "two", "three"} {
				fmt.Fprintf(w, "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", text)
			}
			fmt.Fprint(w, "data: [DONE]\n\n")
		case "big-plain":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"%s"},"finish_reason":"length"}],"usage":{"prompt_tokens":7,"total_tokens":907,"completion_tokens":900}}`,
				model, strings.Repeat("t", 16<<20))
		case "drip":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {")
			for range 6000 {
				if http.NewResponseController(w).Flush() != nil {
					return
				}
				select {
				case <-r.Context().Done():
					return
				case <-time.After(100 * time.Millisecond):
				}
				fmt.Fprint(w, "x")
			}
		case "early-413":
			c, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			body := `{"error":{"message":"request body too large for this engine","type":"invalid_request_error","param":null,"code":413}}`
			fmt.Fprintf(c, "HTTP/1.1 413 Request Entity Too Large\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
			c.Close()
		default:
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"served_by":"engine"}`)
		}
	})
	srv := &http.Server{Handler: mux, ConnContext: func(ctx context.Context, _ net.Conn) context.Context {
		return context.WithValue(ctx, connRequests{}, new(int))
	}}
	return exitCode(srv.Serve(ln))
}

// floodDie waits for file, removes it, floods the engine's output and exits 3.
func floodDie(file string) {
	for os.Remove(file) != nil {
		time.Sleep(10 * time.Millisecond)
	}
	line := strings.Repeat("x", 200)
	for i := range 64 << 10 {
		fmt.Fprintf(os.Stderr, "flood %d %s\n", i, line)
	}
	os.Exit(3)
}

// connRequests keys the count of a connection's requests in its context.
type connRequests struct{}

// modelList answers GET /v1/models listing model.
func modelList(w http.ResponseWriter, model string) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": []map[string]any{{"id": model, "object": "model"}}})
}

func exitCode(err error) int {
	fmt.Fprintln(os.Stderr, "helper engine:", err)
	return 1
}

// reusePort sets SO_REUSEPORT on a socket before it binds.
func reusePort(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	})
	if err != nil {
		return err
	}
	return serr
}
