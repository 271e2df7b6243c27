//go:build !(linux && cgo)

package gpu

import "errors"

func openNVML() (Provider, func(), error) {
	return nil, nil, errors.New("poold was built without cgo, which NVML needs")
}
