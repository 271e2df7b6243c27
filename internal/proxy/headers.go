package proxy

import (
	"fmt"
	"net/http"
	"strings"
)

// Bounds of the client headers forwarded to an engine. Engines have small
// header limits of their own (uvicorn, vLLM's server, refuses a request head
// over 16 KiB) and answer more with a reset, an HTML page or worse; poold
// refuses it first, with a clear 431.
const (
	maxForwardedHeaders     = 64      // header fields (each value counts)
	maxForwardedHeaderBytes = 8 << 10 // names and values together
)

// ownedHeaders are the client headers poold consumes and never forwards: its
// credentials, cookies, content codings (poold reads usage from the plain
// body) and proxy information (an engine is on loopback).
var ownedHeaders = []string{
	"Authorization", "X-Api-Key", "Proxy-Authorization", "Cookie",
	"Accept-Encoding", "Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto",
}

// hopHeaders are the hop-by-hop headers (RFC 9110, 7.6.1): they never cross a
// proxy, nor do the headers a Connection header names.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// forwardedHeaders reports whether h's headers, less those poold does not
// forward, fit the bounds; if not, it says why.
func forwardedHeaders(h http.Header) (ok bool, why string) {
	fields, size := 0, 0
	for k, vs := range h {
		if !forwarded(h, k) {
			continue
		}
		for _, v := range vs {
			fields++
			size += len(k) + len(v)
		}
	}
	switch {
	case fields > maxForwardedHeaders:
		return false, fmt.Sprintf("the request has %d header fields; poold forwards at most %d to an engine", fields, maxForwardedHeaders)
	case size > maxForwardedHeaderBytes:
		return false, fmt.Sprintf("the request's headers hold %d bytes; poold forwards at most %d to an engine", size, maxForwardedHeaderBytes)
	}
	return true, ""
}

// forwarded reports whether header k (canonical) of h goes to the engine.
func forwarded(h http.Header, k string) bool {
	if containsFold(ownedHeaders, k) || containsFold(hopHeaders, k) {
		return false
	}
	for _, v := range h["Connection"] {
		for f := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(f), k) {
				return false
			}
		}
	}
	return true
}

// dropOwned removes the headers poold owns from an outgoing request's h
// (ReverseProxy removes the hop-by-hop ones).
func dropOwned(h http.Header) {
	for _, k := range ownedHeaders {
		h.Del(k)
	}
}

func containsFold(list []string, s string) bool {
	for _, e := range list {
		if strings.EqualFold(e, s) {
			return true
		}
	}
	return false
}
