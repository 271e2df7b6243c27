package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// vllmTypes are the error type names vLLM (and FastAPI, for a body it
// fails to validate) writes, each with OpenAI's; OpenAI's own are kept. A
// name not here takes the type of its status (errorType).
var vllmTypes = map[string]string{
	"BadRequestError":         "invalid_request_error",
	"Bad Request":             "invalid_request_error",
	"NotFoundError":           "not_found_error",
	"UnauthorizedError":       "authentication_error",
	"PermissionDeniedError":   "permission_error",
	"InternalServerError":     "server_error",
	"ServiceUnavailableError": "service_unavailable",

	"invalid_request_error": "invalid_request_error",
	"authentication_error":  "authentication_error",
	"permission_error":      "permission_error",
	"not_found_error":       "not_found_error",
	"server_error":          "server_error",
	"service_unavailable":   "service_unavailable",
}

// engineFields are the members of an engine's error that EngineError reads,
// wherever they sit: inside "error" (vLLM's current shape), at the top level
// (an older vLLM's, with "object": "error"), or FastAPI's "detail".
type engineFields struct {
	Message any             `json:"message"`
	Type    any             `json:"type"`
	Param   any             `json:"param"`
	Code    any             `json:"code"`
	Detail  json.RawMessage `json:"detail"`
	Error   json.RawMessage `json:"error"`
}

// validationError is one of FastAPI's {"detail": [...]} entries.
type validationError struct {
	Loc []any  `json:"loc"`
	Msg string `json:"msg"`
}

// EngineError rewrites an engine's JSON error answer (its status and body)
// into the shape the route's clients read: OpenAI's {"error": {"message",
// "type", "param", "code"}} with a string code, or, for the Anthropic
// Messages route (anthropic), Anthropic's {"type": "error", "error":
// {"type", "message"}}. It reads vLLM's shapes: {"error": {…, "type":
// "NotFoundError", "code": 404}}, an older vLLM's {"object": "error",
// "message", …} at the top level, and FastAPI's {"detail": "Not Found"} (a
// route the model's engine does not serve) or {"detail": [{"loc", "msg"},
// …]} (a body it failed to validate). The message and param are the
// engine's; the type is OpenAI's for vLLM's (vllmTypes) or for the status;
// the code is the engine's when it is a string, route_not_served for
// FastAPI's 404, else engine_error. A body already in the route's shape,
// or not a JSON object, is returned as it is, with false.
func EngineError(status int, body []byte, anthropic bool) ([]byte, bool) {
	var top engineFields
	if !isObject(body) || json.Unmarshal(body, &top) != nil {
		return body, false
	}
	f, nested := top, false
	var inner engineFields
	if isObject(top.Error) && json.Unmarshal(top.Error, &inner) == nil {
		f, nested = inner, true
	}
	msg, isMsg := f.Message.(string)
	typ, isType := f.Type.(string)
	if anthropic && nested && top.Type == "error" && isMsg && isType {
		return body, false // Anthropic's already
	}
	if !anthropic && nested && isMsg && isType && (f.Code == nil || isString(f.Code)) {
		return body, false // OpenAI's already
	}
	e := apiError{Type: errorType(status), Code: "engine_error"}
	if t, ok := vllmTypes[typ]; ok {
		e.Type = t
	}
	if c, ok := f.Code.(string); ok && c != "" {
		e.Code = c
	}
	if p, ok := f.Param.(string); ok && p != "" {
		e.Param = &p
	}
	switch {
	case isMsg && msg != "":
		e.Message = msg
	case len(f.Detail) > 0:
		e.Message = detailMessage(status, f.Detail, &e)
	default:
		e.Message = fmt.Sprintf("engine answered %d: %s", status, bytes.TrimSpace(body))
	}
	if anthropic {
		return append(marshal(anthropicBody(status, e)), '\n'), true
	}
	return append(marshal(errorBody{e}), '\n'), true
}

// detailMessage is the message of FastAPI's {"detail": …}: its text, or
// each validation error as "loc: msg" (the first's loc also becomes e's
// param). Its 404 "Not Found" is a route that the engine does not serve:
// e's code becomes route_not_served.
func detailMessage(status int, detail json.RawMessage, e *apiError) string {
	var text string
	if json.Unmarshal(detail, &text) == nil {
		if status == http.StatusNotFound && text == "Not Found" {
			e.Code = "route_not_served"
			return "Not Found: the model's engine does not serve this route"
		}
		return text
	}
	var list []validationError
	if json.Unmarshal(detail, &list) != nil || len(list) == 0 {
		return fmt.Sprintf("engine answered %d: %s", status, bytes.TrimSpace(detail))
	}
	msgs := make([]string, len(list))
	for i, v := range list {
		loc := make([]string, len(v.Loc))
		for j, l := range v.Loc {
			loc[j] = fmt.Sprint(l)
		}
		where := strings.Join(loc, ".")
		if i == 0 && where != "" && e.Param == nil {
			e.Param = &where
		}
		msgs[i] = strings.TrimPrefix(where+": "+v.Msg, ": ")
	}
	return strings.Join(msgs, "; ")
}

// isObject reports whether the JSON text b is an object.
func isObject(b []byte) bool {
	b = bytes.TrimSpace(b)
	return len(b) > 0 && b[0] == '{'
}

func isString(v any) bool {
	_, ok := v.(string)
	return ok
}

// anthropicError is Anthropic's error body, {"type": "error", "error":
// {"type", "message"}}, with poold's code beside the message: Anthropic's
// shape has no code, and its clients ignore a member they do not know.
type anthropicError struct {
	Type  string          `json:"type"` // always "error"
	Error anthropicDetail `json:"error"`
}

type anthropicDetail struct {
	Type    string `json:"type"`
	Message string `json:"message"`
	Code    string `json:"code,omitempty"`
}

// anthropicBody is e, an error answered with status, in Anthropic's shape:
// the type is Anthropic's for the status, the param is left out (the
// message names it).
func anthropicBody(status int, e apiError) anthropicError {
	code, _ := e.Code.(string)
	return anthropicError{Type: "error", Error: anthropicDetail{Type: anthropicType(status), Message: e.Message, Code: code}}
}

// anthropicType maps a status to Anthropic's error type name.
func anthropicType(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusMethodNotAllowed, http.StatusUnprocessableEntity, http.StatusRequestHeaderFieldsTooLarge:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	default:
		return "api_error"
	}
}
