//go:build !vtprotobuf

package rls

// vtprotobuf: built without go-control-plane's vtprotobuf marshalers (the
// vtprotobuf build tag), so the codec writes responses with grpc's codec.
const vtprotobuf = false
