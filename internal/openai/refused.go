package openai

// RefusedHeader is set by poold on a 503 that refused a request before it
// started anything on the host: no load, and no wait in a queue that could
// have begun one (a full queue or body budget at arrival, restarts backing
// off, a pool removed, a shutdown). Its value is the error code. Another host may take
// such a request; a 503 without it (a queue wait that timed out) must not be
// retried, since the load it waited for is under way.
const RefusedHeader = "X-Poold-Refused"
