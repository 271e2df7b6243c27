package fleet

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/poold/poold/internal/statusapi"
)

// A host whose /status lists more pools than fleetd accepts, or whose
// /v1/models more models, is refused: never healthy, its models not
// listed, the refusal logged once and shown as its last error. A host
// within the bounds beside it serves on.
func TestStatusBounds(t *testing.T) {
	var pools []statusapi.Pool
	for i := range maxPools + 1 {
		pools = append(pools, readyPool(fmt.Sprintf("gpu%d", i), "qwen", 0))
	}
	manyPools := newFakeHost(t, "many-pools", pools, model("qwen", "qwen"))
	var models []hostModel
	for i := range maxModels + 1 {
		models = append(models, model(fmt.Sprintf("m%d", i), "qwen"))
	}
	manyModels := newFakeHost(t, "many-models", []statusapi.Pool{readyPool("gpu0", "qwen", 0)}, models...)
	fine := newFakeHost(t, "fine", []statusapi.Pool{readyPool("gpu0", "qwen", 0)}, model("qwen", "qwen"))
	var logs lockedLog
	tf := startFleet(t, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))}, HandlerOptions{}, fine)
	tf.fleet.Apply(&File{Hosts: []HostSpec{fine.spec(), manyPools.spec(), manyModels.spec()}})
	for name, want := range map[string]string{"many-pools": "257 pools in /status, at most 256", "many-models": "4097 models in /v1/models, at most 4096"} {
		h := tf.waitHost(name, "refused", func(s statusapi.Host) bool { return s.LastError != nil && s.PollFailures >= 2 })
		if h.Healthy || len(h.Pools) != 0 || !strings.Contains(*h.LastError, want) {
			t.Fatalf("%s: healthy %v, %d pools, last error %q, want %q", name, h.Healthy, len(h.Pools), *h.LastError, want)
		}
		if n := strings.Count(logs.String(), `msg="host status refused" component=fleet host=`+name+" "); n != 1 {
			t.Fatalf("%s: refusal logged %d times, want once:\n%s", name, n, logs.String())
		}
	}
	if names := modelNames(tf.fleet.snapshot(), nil); len(names) != 1 || names[0] != "qwen" {
		t.Fatalf("models listed: %d, want only qwen from the host within the bounds", len(names))
	}
	if resp, body := tf.post(`{"model": "qwen"}`); resp.StatusCode != 200 || !strings.Contains(body, "fine") {
		t.Fatalf("the host within the bounds: %d %s", resp.StatusCode, body)
	}
}
