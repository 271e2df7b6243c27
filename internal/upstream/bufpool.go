package upstream

import "sync"

// copyBufferSize is the size of the buffers ReverseProxy copies response
// bodies through. A stream holds its buffer for as long as it lasts, so it is
// kept small: SSE events are a few hundred bytes, and a larger JSON body only
// takes a few more reads.
const copyBufferSize = 2 << 10

// BufferPool lends ReverseProxy its copy buffers (httputil.BufferPool), so
// that a request does not allocate a fresh 32 KiB one. It pools array
// pointers, so that neither Get nor Put allocates. The zero value is ready.
type BufferPool struct{ p sync.Pool }

// Get implements httputil.BufferPool.
func (b *BufferPool) Get() []byte {
	if a, ok := b.p.Get().(*[copyBufferSize]byte); ok {
		return a[:]
	}
	return new([copyBufferSize]byte)[:]
}

// Put implements httputil.BufferPool.
func (b *BufferPool) Put(buf []byte) {
	if len(buf) == copyBufferSize {
		b.p.Put((*[copyBufferSize]byte)(buf))
	}
}
