package rls

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// descriptorOf is a descriptor of the key and value pairs kv.
func descriptorOf(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// twoDescriptors is the request of a route with two actions, as Envoy
// sends it.
func twoDescriptors() *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		descriptorOf("remote_address", "10.1.2.3", "path", "/api/v1/orders"),
		descriptorOf("tenant", "acme", "method", "POST"),
	}}
}

func mustMarshal(tb testing.TB, m proto.Message) []byte {
	tb.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// requestSeeds are encodings of requests: real ones, and what a decoder
// must treat as proto.Unmarshal does.
func requestSeeds(tb testing.TB) [][]byte {
	full := mustMarshal(tb, &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 3, Descriptors: []*ratelimitv3.RateLimitDescriptor{
		descriptorOf("remote_address", "10.1.2.3", "path", "/api/v1/orders"),
		{
			Entries:    []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: "ünïcødé"}},
			Limit:      &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 42, Unit: typev3.RateLimitUnit_MINUTE, UnitMultiplier: wrapperspb.UInt32(30)},
			HitsAddend: wrapperspb.UInt64(1 << 40),
		},
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user"}}, HitsAddend: wrapperspb.UInt64(0), IsNegativeHits: true},
		{},
	}})
	seeds := [][]byte{
		nil,
		full,
		mustMarshal(tb, twoDescriptors()),
		mustMarshal(tb, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{{Limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{}}}}),
	}
	for n := 1; n < len(full); n += 7 { // truncations
		seeds = append(seeds, full[:n])
	}
	// A field of each wire type that the messages do not have, in each
	// message; a group holding a nested group.
	unknown := func(b []byte) []byte {
		b = protowire.AppendTag(b, 99, protowire.VarintType)
		b = protowire.AppendVarint(b, 1<<63)
		b = protowire.AppendTag(b, 100, protowire.Fixed32Type)
		b = protowire.AppendFixed32(b, 7)
		b = protowire.AppendTag(b, 101, protowire.Fixed64Type)
		b = protowire.AppendFixed64(b, 7)
		b = protowire.AppendTag(b, 102, protowire.BytesType)
		b = protowire.AppendString(b, "\xff not UTF-8, but unknown")
		b = protowire.AppendTag(b, 103, protowire.StartGroupType)
		b = protowire.AppendTag(b, 1, protowire.StartGroupType)
		b = protowire.AppendTag(b, 2, protowire.VarintType)
		b = protowire.AppendVarint(b, 5)
		b = protowire.AppendTag(b, 1, protowire.EndGroupType)
		b = protowire.AppendTag(b, 103, protowire.EndGroupType)
		return b
	}
	entry := func(k, v string) []byte {
		b := protowire.AppendTag(nil, 1, protowire.BytesType)
		b = protowire.AppendString(b, k)
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		return protowire.AppendString(b, v)
	}
	msg := func(b []byte, num protowire.Number, m []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), m)
	}
	varint := func(b []byte, num protowire.Number, v uint64) []byte {
		return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
	}
	domain := msg(nil, 1, []byte("edge"))

	// Unknown fields everywhere.
	desc := msg(nil, 1, append(entry("k", "v"), unknown(nil)...))
	desc = msg(desc, 2, varint(unknown(nil), 1, 5))
	desc = msg(desc, 3, varint(unknown(nil), 1, 9))
	desc = unknown(desc)
	seeds = append(seeds, unknown(msg(append(unknown(nil), domain...), 2, desc)))

	// A singular message twice: the limit and the hits_addend merge;
	// scalars twice: the last wins; an empty hits_addend.
	desc = msg(nil, 2, varint(varint(nil, 1, 10), 2, 3))
	desc = msg(desc, 2, msg(varint(nil, 1, 20), 3, varint(nil, 1, 4)))
	desc = msg(desc, 2, msg(nil, 3, nil))
	desc = msg(desc, 3, varint(nil, 1, 9))
	desc = msg(desc, 3, nil)
	desc = varint(varint(desc, 4, 1), 4, 0)
	seeds = append(seeds, varint(varint(msg(msg(domain, 1, []byte("other")), 2, desc), 3, 7), 3, 8))

	// Known numbers of another wire type (proto keeps them as unknown);
	// a bool of a large varint; an enum and a uint32 beyond their range;
	// an overlong varint.
	desc = msg(nil, 2, varint(varint(nil, 2, 1<<40), 1, 1<<33|5))
	desc = varint(desc, 1, 5)
	desc = varint(desc, 4, 1<<62)
	desc = protowire.AppendFixed32(protowire.AppendTag(desc, 3, protowire.Fixed32Type), 1)
	bad := varint(nil, 1, 7)
	bad = protowire.AppendFixed64(protowire.AppendTag(bad, 2, protowire.Fixed64Type), 1)
	bad = msg(bad, 3, nil)
	bad = append(bad, 0x18, 0x81, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00)
	seeds = append(seeds, msg(bad, 2, desc))

	// Invalid UTF-8 in the domain, a key, a value.
	seeds = append(seeds,
		msg(nil, 1, []byte("ed\xffge")),
		msg(domain, 2, msg(nil, 1, entry("k\xc3", "v"))),
		msg(domain, 2, msg(nil, 1, entry("k", "\xed\xa0\x80"))),
	)

	// Malformed: field number 0, beyond the largest, a lone end of group,
	// a group that does not end, reserved wire types, a varint too long,
	// a length beyond the message, a nested one beyond its parent.
	seeds = append(seeds,
		[]byte{0x02, 0x00},
		protowire.AppendVarint(nil, uint64(protowire.MaxValidNumber+1)<<3),
		append(append([]byte{}, domain...), 0x0c),
		protowire.AppendTag(nil, 5, protowire.StartGroupType),
		append(append([]byte{}, domain...), 0x0e, 0x01),
		[]byte{0x0f},
		[]byte{0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02},
		[]byte{0x0a, 0x05, 'e'},
		[]byte{0x12, 0x04, 0x0a, 0x05, 0x0a, 0x00},
		msg(nil, 2, protowire.AppendTag(nil, 1, protowire.EndGroupType)),
	)
	return seeds
}

// clearUnknown drops the unknown fields of m and of every message in it.
func clearUnknown(m protoreflect.Message) {
	m.SetUnknown(nil)
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				v.Map().Range(func(_ protoreflect.MapKey, v protoreflect.Value) bool {
					clearUnknown(v.Message())
					return true
				})
			}
		case fd.Message() == nil:
		case fd.IsList():
			for i := range v.List().Len() {
				clearUnknown(v.List().Get(i).Message())
			}
		default:
			clearUnknown(v.Message())
		}
		return true
	})
}

// buffersOf is data in buffers of n bytes, as a message arrives in frames.
func buffersOf(data []byte, n int) mem.BufferSlice {
	var s mem.BufferSlice
	for len(data) > n {
		s, data = append(s, mem.SliceBuffer(data[:n])), data[n:]
	}
	return append(s, mem.SliceBuffer(data))
}

// FuzzCodecMatchesProto: the codec reads any bytes as proto.Unmarshal
// reads them into a RateLimitRequest, but for the unknown fields it drops:
// both fail, or both give equal requests. Strings shared in one copy or
// copied each, and a message in one buffer or in several, read alike.
func FuzzCodecMatchesProto(f *testing.F) {
	for _, s := range requestSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		want := &rlsv3.RateLimitRequest{}
		wantErr := proto.Unmarshal(data, want)
		if wantErr == nil {
			clearUnknown(want.ProtoReflect())
		}
		for _, c := range []struct {
			name   string
			decode func(*rlsv3.RateLimitRequest) error
		}{
			{"shared strings", func(m *rlsv3.RateLimitRequest) error { return decodeRequest(data, m, true) }},
			{"copied strings", func(m *rlsv3.RateLimitRequest) error { return decodeRequest(data, m, false) }},
			{"codec, 3-byte buffers", func(m *rlsv3.RateLimitRequest) error { return codec{}.Unmarshal(buffersOf(data, 3), m) }},
		} {
			got := &rlsv3.RateLimitRequest{Domain: "stale", HitsAddend: 1, Descriptors: []*ratelimitv3.RateLimitDescriptor{{}}}
			err := c.decode(got)
			switch {
			case (err == nil) != (wantErr == nil):
				t.Fatalf("%s: %x: error %v, proto.Unmarshal's %v", c.name, data, err, wantErr)
			case err != nil && !errors.Is(err, errDecode):
				t.Fatalf("%s: %x: error %v is not errDecode", c.name, data, err)
			case err == nil && !proto.Equal(got, want):
				t.Fatalf("%s: %x:\n got %v\nwant %v", c.name, data, got, want)
			}
		}
	})
}

// The strings of a request never alias the buffer it was read from, which
// grpc reuses once Unmarshal returns.
func TestCodecStringsOutliveBuffer(t *testing.T) {
	for _, share := range []bool{true, false} {
		data := mustMarshal(t, twoDescriptors())
		m := &rlsv3.RateLimitRequest{}
		if err := decodeRequest(data, m, share); err != nil {
			t.Fatal(err)
		}
		clear(data)
		if !proto.Equal(m, twoDescriptors()) {
			t.Errorf("share %v: after the buffer is cleared: %v", share, m)
		}
	}
}

// responseOf is an answer of n statuses with all the service fills in.
func responseOf(n int, over bool) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	for i := range n {
		st := &rlsv3.RateLimitResponse_DescriptorStatus{
			Code: rlsv3.RateLimitResponse_OK,
			CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{
				Name: fmt.Sprintf("limit-%d", i), RequestsPerUnit: 100, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE,
				UnitMultiplier: wrapperspb.UInt32(uint32(i + 1)),
			},
			LimitRemaining:     uint32(99 - i),
			DurationUntilReset: durationpb.New(1500 * time.Millisecond),
		}
		if over && i == n-1 {
			st.Code, st.LimitRemaining = rlsv3.RateLimitResponse_OVER_LIMIT, 0
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		resp.Statuses = append(resp.Statuses, st)
	}
	return resp
}

// Marshal writes responses that proto.Unmarshal reads back equal: in a
// plain buffer when small, in a pooled one when large; other messages as
// grpc's codec writes them.
func TestCodecMarshal(t *testing.T) {
	withAll := responseOf(3, true)
	withAll.ResponseHeadersToAdd = []*corev3.HeaderValue{
		{Key: "RateLimit-Policy", Value: `"edge";q=100;w=60`}, {Key: "RateLimit", Value: `"edge";r=0;t=1`}, {Key: "Retry-After", Value: "1"},
	}
	withAll.RequestHeadersToAdd = []*corev3.HeaderValue{{Key: "x-quota", Value: "over"}}
	meta, err := structpb.NewStruct(map[string]any{"domain": "edge", "descriptors": []any{map[string]any{"entries": []any{"user=a"}, "hitsAddend": 2}}, "ok": true, "none": nil})
	if err != nil {
		t.Fatal(err)
	}
	withAll.DynamicMetadata = meta
	large := responseOf(40, false)
	for _, c := range []struct {
		name string
		msg  proto.Message
	}{
		{"ok", responseOf(2, false)},
		{"over_limit", responseOf(2, true)},
		{"empty", &rlsv3.RateLimitResponse{}},
		{"headers and metadata", withAll},
		{"pooled", large},
		{"request", twoDescriptors()},
	} {
		data, err := codec{}.Marshal(c.msg)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		b := data.Materialize()
		data.Free()
		got := c.msg.ProtoReflect().New().Interface()
		if err := proto.Unmarshal(b, got); err != nil || !proto.Equal(got, c.msg) {
			t.Errorf("%s: read back %v, %v; want %v", c.name, got, err, c.msg)
		}
	}
	if size := proto.Size(large); mem.IsBelowBufferPoolingThreshold(size) {
		t.Fatalf("the large response is %d bytes, below the pooling threshold", size)
	}

	other := &structpb.Struct{Fields: map[string]*structpb.Value{"a": structpb.NewStringValue("b")}}
	if _, ok := any(&rlsv3.RateLimitResponse{}).(vtMessage); ok != vtprotobuf {
		t.Fatalf("RateLimitResponse has the vtprotobuf marshaler: %v; built with the vtprotobuf tag: %v", ok, vtprotobuf)
	}
	if _, ok := any(other).(vtMessage); ok {
		t.Fatal("structpb.Struct has a vtprotobuf marshaler: pick another message")
	}
	ours, err := codec{}.Marshal(other)
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := protoCodec.Marshal(other)
	if err != nil {
		t.Fatal(err)
	}
	if string(ours.Materialize()) != string(theirs.Materialize()) {
		t.Errorf("a message of another service: %x, grpc's codec %x", ours.Materialize(), theirs.Materialize())
	}
	back := &structpb.Struct{}
	if err := (codec{}).Unmarshal(ours, back); err != nil || !proto.Equal(back, other) {
		t.Errorf("a message of another service read back %v, %v", back, err)
	}
	if codec.Name(codec{}) != "proto" {
		t.Errorf("Name() = %q, want proto", codec{}.Name())
	}
}

// A request decoded by the codec is one proto.Unmarshal can fail on only
// where the codec fails too: a string of invalid UTF-8 names its field.
func TestCodecUnmarshalErrors(t *testing.T) {
	for _, c := range []struct {
		data []byte
		want string
	}{
		{[]byte{0x0a, 0x02, 'e', 0xff}, "domain"},
		{[]byte{0x12, 0x05, 0x0a, 0x03, 0x0a, 0x01, 0xc3}, "key"},
		{[]byte{0x12, 0x05, 0x0a, 0x03, 0x12, 0x01, 0xc3}, "value"},
		{[]byte{0x0a, 0x05, 'e'}, "unexpected EOF"},
		{[]byte{0x00}, "field number"},
	} {
		err := codec{}.Unmarshal(buffersOf(c.data, 100), &rlsv3.RateLimitRequest{})
		if !errors.Is(err, errDecode) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%x: %v, want errDecode naming %s", c.data, err, c.want)
		}
	}
}

// BenchmarkCodec reads a request of two descriptors and writes a response
// of two statuses, with this codec and with grpc's.
func BenchmarkCodec(b *testing.B) {
	req := mustMarshal(b, twoDescriptors())
	resp := responseOf(2, false)
	for _, c := range []struct {
		name  string
		codec interface {
			Marshal(any) (mem.BufferSlice, error)
			Unmarshal(mem.BufferSlice, any) error
		}
	}{{"rls", codec{}}, {"grpc", protoCodec}} {
		b.Run("unmarshal/"+c.name, func(b *testing.B) {
			b.ReportAllocs()
			data := mem.BufferSlice{mem.SliceBuffer(req)}
			for b.Loop() {
				if err := c.codec.Unmarshal(data, &rlsv3.RateLimitRequest{}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("marshal/"+c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				data, err := c.codec.Marshal(resp)
				if err != nil {
					b.Fatal(err)
				}
				data.Free()
			}
		})
	}
}

// echo answers a request with a status per descriptor, its domain, and
// the length of the unknown fields it kept.
type echo struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (echo) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	resp := responseOf(len(req.GetDescriptors()), false)
	resp.ResponseHeadersToAdd = []*corev3.HeaderValue{
		{Key: "domain", Value: req.GetDomain()},
		{Key: "unknown", Value: strconv.Itoa(len(req.ProtoReflect().GetUnknown()))},
	}
	return resp, nil
}

// rawCodec sends a []byte as it is, as a client with a broken encoder
// would, and everything else as grpc does.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if b, ok := v.([]byte); ok {
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	return protoCodec.Marshal(v)
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error { return protoCodec.Unmarshal(data, v) }

// serveEcho serves echo and the health service on a grpc.Server of opts and
// returns a client connection to it.
func serveEcho(t *testing.T, opts ...grpc.ServerOption) *grpc.ClientConn {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	g := grpc.NewServer(opts...)
	rlsv3.RegisterRateLimitServiceServer(g, echo{})
	h := health.NewServer()
	healthpb.RegisterHealthServer(g, h)
	served := make(chan error, 1)
	go func() { served <- g.Serve(lis) }()
	t.Cleanup(func() {
		g.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// The server's options read requests with the codec (which drops unknown
// fields, where grpc's codec keeps them), answer one it cannot read
// INTERNAL as grpc's codec does, and leave the health service as it was.
func TestServerCodec(t *testing.T) {
	known := mustMarshal(t, twoDescriptors())
	withUnknown := protowire.AppendString(protowire.AppendTag(append([]byte{}, known...), 99, protowire.BytesType), "x")
	invalid := protowire.AppendString(protowire.AppendTag(append([]byte{}, known...), 1, protowire.BytesType), "\xff")
	for _, c := range []struct {
		name    string
		opts    []grpc.ServerOption
		unknown string
	}{
		{"rls", serverOptions(), "0"},
		{"grpc", nil, strconv.Itoa(len(withUnknown) - len(known))},
	} {
		conn := serveEcho(t, c.opts...)
		resp := &rlsv3.RateLimitResponse{}
		err := conn.Invoke(t.Context(), rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, withUnknown, resp, grpc.ForceCodecV2(rawCodec{}))
		hs := resp.GetResponseHeadersToAdd()
		if err != nil || len(resp.GetStatuses()) != 2 || len(hs) != 2 || hs[0].GetValue() != "edge" || hs[1].GetValue() != c.unknown {
			t.Errorf("%s: a request with an unknown field: %v, %v; want 2 statuses, domain edge, %s bytes unknown", c.name, resp, err, c.unknown)
		}
		err = conn.Invoke(t.Context(), rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, invalid, &rlsv3.RateLimitResponse{}, grpc.ForceCodecV2(rawCodec{}))
		if status.Code(err) != codes.Internal {
			t.Errorf("%s: a domain of invalid UTF-8: %v, want INTERNAL", c.name, err)
		}
		h, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{})
		if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("%s: health: %v, %v", c.name, h, err)
		}
	}
}
