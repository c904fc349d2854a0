package rls

import (
	"errors"
	"fmt"
	"unicode/utf8"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// protoCodec is grpc's own proto codec, registered by its package's init:
// the codec of every message that is not the service's.
var protoCodec = encoding.GetCodecV2(grpcproto.Name)

// codec is the gRPC server's codec: the service's messages without
// reflection, everything else (health, reflection) by protoCodec. A
// response is written by the vtprotobuf marshalers go-control-plane
// generates; a RateLimitRequest, for which it generates no unmarshaler,
// is read by decodeRequest. It is named "proto", so the content-subtype
// stays application/grpc+proto.
type codec struct{}

// vtMessage is a message with vtprotobuf's generated marshaler.
type vtMessage interface {
	SizeVT() int
	MarshalToSizedBufferVTStrict([]byte) (int, error)
}

func (codec) Name() string { return grpcproto.Name }

// Marshal writes a vtMessage into a buffer of its size, from grpc's pool
// when it is large enough to be pooled, as grpc's codec does. Unlike
// proto.Marshal, vtprotobuf does not check that strings are valid UTF-8:
// a response's come from a request, which decodeRequest checked, from the
// descriptors file, which YAML requires to be UTF-8, or from quotad's own
// header fields.
func (codec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(vtMessage)
	if !ok {
		return protoCodec.Marshal(v)
	}
	size := m.SizeVT()
	if mem.IsBelowBufferPoolingThreshold(size) {
		buf := make([]byte, size)
		if err := marshalVT(m, buf); err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(buf)}, nil
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	if err := marshalVT(m, (*buf)[:size]); err != nil {
		pool.Put(buf)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

// marshalVT writes m into buf, which is m.SizeVT() bytes: the marshaler
// writes from the end, so it must fill buf exactly (it does not when m
// changed since it was sized).
func marshalVT(m vtMessage, buf []byte) error {
	n, err := m.MarshalToSizedBufferVTStrict(buf)
	if err != nil {
		return fmt.Errorf("marshal %T: %w", m, err)
	}
	if n != len(buf) {
		return fmt.Errorf("marshal %T: %d bytes written, %d sized", m, n, len(buf))
	}
	return nil
}

// Unmarshal reads a RateLimitRequest with decodeRequest, in place when
// data is one buffer (as grpc's codec does), and any other message with
// protoCodec.
func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(*rlsv3.RateLimitRequest)
	if !ok {
		return protoCodec.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return decodeRequest(buf.ReadOnlyData(), m, len(buf.ReadOnlyData()) <= shareStringBytes)
}

// shareStringBytes is the largest request (bytes) whose strings share one
// copy of the whole message: one allocation for all of them. A string of
// a larger one is a copy of its own, so that a string kept after the call
// never keeps the rest of a large message alive. Envoy's requests are a
// few hundred bytes.
const shareStringBytes = 4 << 10

// errDecode is a request that is not a valid RateLimitRequest encoding;
// grpc answers it INTERNAL, as for any message its codec cannot read.
var errDecode = errors.New("decode rate limit request")

// decodeRequest reads the encoding b of a RateLimitRequest into m, as
// proto.Unmarshal does, except that unknown fields are dropped (nothing
// reads them): a field of an unknown number, or of a known number with
// another wire type, is skipped; of a scalar that appears twice the last
// wins; a singular message that appears twice is the merge of both; a
// string must be valid UTF-8; a malformed or truncated encoding is an
// error. The strings of m are substrings of one copy of b when share is
// set, else copies of their own; none aliases b.
func decodeRequest(b []byte, m *rlsv3.RateLimitRequest, share bool) error {
	m.Reset()
	d := decoder{}
	if share {
		d.s = string(b)
	}
	if descs, entries := countDescriptors(b); descs > 0 {
		d.descs = make([]ratelimitv3.RateLimitDescriptor, descs)
		m.Descriptors = make([]*ratelimitv3.RateLimitDescriptor, 0, descs)
		if entries > 0 {
			d.entries = make([]ratelimitv3.RateLimitDescriptor_Entry, entries)
			d.entryPtrs = make([]*ratelimitv3.RateLimitDescriptor_Entry, 0, entries)
		}
	}
	r := reader{b: b}
	for len(r.b) > 0 {
		num, typ, err := r.tag()
		if err != nil {
			return err
		}
		switch {
		case num == 1 && typ == protowire.BytesType:
			m.Domain, err = d.string(&r, "domain")
		case num == 2 && typ == protowire.BytesType:
			var sub reader
			if sub, err = r.message(); err == nil {
				desc := d.newDescriptor()
				m.Descriptors = append(m.Descriptors, desc)
				err = d.descriptor(sub, desc)
			}
		case num == 3 && typ == protowire.VarintType:
			var v uint64
			v, err = r.varint()
			m.HitsAddend = uint32(v)
		default:
			err = r.skip(num, typ)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// decoder holds what the messages of one request share: s, the copy of
// the whole encoding its strings are cut from, or "" when each string is
// a copy of its own; descs and entries, allocated at once as many as
// countDescriptors found, which newDescriptor and newEntry hand out in
// turn (and allocate one by one when they run out, which only a malformed
// encoding makes them do); entryPtrs, the pointers to the entries read so
// far, in which each descriptor's are one run that becomes its Entries.
type decoder struct {
	s         string
	descs     []ratelimitv3.RateLimitDescriptor
	entries   []ratelimitv3.RateLimitDescriptor_Entry
	entryPtrs []*ratelimitv3.RateLimitDescriptor_Entry
}

func (d *decoder) newDescriptor() *ratelimitv3.RateLimitDescriptor {
	if len(d.descs) == 0 {
		return &ratelimitv3.RateLimitDescriptor{}
	}
	desc := &d.descs[0]
	d.descs = d.descs[1:]
	return desc
}

func (d *decoder) newEntry() *ratelimitv3.RateLimitDescriptor_Entry {
	if len(d.entries) == 0 {
		return &ratelimitv3.RateLimitDescriptor_Entry{}
	}
	e := &d.entries[0]
	d.entries = d.entries[1:]
	return e
}

// countDescriptors counts the descriptors of the request encoded in b and their
// entries, as far as b is well formed.
func countDescriptors(b []byte) (descs, entries int) {
	r := reader{b: b}
	for len(r.b) > 0 {
		num, typ, err := r.tag()
		if err != nil {
			return descs, entries
		}
		if num != 2 || typ != protowire.BytesType {
			if r.skip(num, typ) != nil {
				return descs, entries
			}
			continue
		}
		desc, err := r.message()
		if err != nil {
			return descs, entries
		}
		descs++
		for len(desc.b) > 0 {
			num, typ, err := desc.tag()
			if err != nil || desc.skip(num, typ) != nil {
				break
			}
			if num == 1 && typ == protowire.BytesType {
				entries++
			}
		}
	}
	return descs, entries
}

// string reads a string field named name from r.
func (d *decoder) string(r *reader, name string) (string, error) {
	v, off, err := r.bytes()
	if err != nil {
		return "", err
	}
	if !utf8.Valid(v) {
		return "", fmt.Errorf("%w: %s is not valid UTF-8", errDecode, name)
	}
	if d.s == "" {
		return string(v), nil
	}
	return d.s[off : off+len(v)], nil
}

// descriptor reads a RateLimitDescriptor from r into desc, merging into
// what desc holds.
func (d *decoder) descriptor(r reader, desc *ratelimitv3.RateLimitDescriptor) error {
	first := len(d.entryPtrs)
	for len(r.b) > 0 {
		num, typ, err := r.tag()
		if err != nil {
			return err
		}
		switch {
		case num == 1 && typ == protowire.BytesType:
			var sub reader
			if sub, err = r.message(); err == nil {
				e := d.newEntry()
				d.entryPtrs = append(d.entryPtrs, e)
				err = d.readEntry(sub, e)
			}
		case num == 2 && typ == protowire.BytesType:
			var sub reader
			if sub, err = r.message(); err == nil {
				if desc.Limit == nil {
					desc.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{}
				}
				err = d.override(sub, desc.Limit)
			}
		case num == 3 && typ == protowire.BytesType:
			var sub reader
			if sub, err = r.message(); err == nil {
				if desc.HitsAddend == nil {
					desc.HitsAddend = &wrapperspb.UInt64Value{}
				}
				var v uint64
				v, err = sub.wrapped(desc.HitsAddend.Value)
				desc.HitsAddend.Value = v
			}
		case num == 4 && typ == protowire.VarintType:
			var v uint64
			v, err = r.varint()
			desc.IsNegativeHits = v != 0
		default:
			err = r.skip(num, typ)
		}
		if err != nil {
			return err
		}
	}
	if n := len(d.entryPtrs); n > first {
		desc.Entries = d.entryPtrs[first:n:n] // full, so that no append reaches the next descriptor's
	}
	return nil
}

// readEntry reads a descriptor's Entry from r into e.
func (d *decoder) readEntry(r reader, e *ratelimitv3.RateLimitDescriptor_Entry) error {
	for len(r.b) > 0 {
		num, typ, err := r.tag()
		if err != nil {
			return err
		}
		switch {
		case num == 1 && typ == protowire.BytesType:
			e.Key, err = d.string(&r, "key")
		case num == 2 && typ == protowire.BytesType:
			e.Value, err = d.string(&r, "value")
		default:
			err = r.skip(num, typ)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// override reads a descriptor's limit override from r into o, merging
// into what o holds.
func (d *decoder) override(r reader, o *ratelimitv3.RateLimitDescriptor_RateLimitOverride) error {
	for len(r.b) > 0 {
		num, typ, err := r.tag()
		if err != nil {
			return err
		}
		switch {
		case num == 1 && typ == protowire.VarintType:
			var v uint64
			v, err = r.varint()
			o.RequestsPerUnit = uint32(v)
		case num == 2 && typ == protowire.VarintType:
			var v uint64
			v, err = r.varint()
			o.Unit = typev3.RateLimitUnit(int32(v))
		case num == 3 && typ == protowire.BytesType:
			var sub reader
			if sub, err = r.message(); err == nil {
				if o.UnitMultiplier == nil {
					o.UnitMultiplier = &wrapperspb.UInt32Value{}
				}
				var v uint64
				v, err = sub.wrapped(uint64(o.UnitMultiplier.Value))
				o.UnitMultiplier.Value = uint32(v)
			}
		default:
			err = r.skip(num, typ)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// reader reads the fields of one message: b is what is left of it, at
// offset off of the whole request.
type reader struct {
	b   []byte
	off int
}

func (r *reader) advance(n int) {
	r.b = r.b[n:]
	r.off += n
}

// tag reads a field's tag: its number and wire type.
func (r *reader) tag() (protowire.Number, protowire.Type, error) {
	v, n := protowire.ConsumeVarint(r.b)
	if n < 0 {
		return 0, 0, r.errorAt(n)
	}
	if num := v >> 3; num < uint64(protowire.MinValidNumber) || num > uint64(protowire.MaxValidNumber) {
		return 0, 0, fmt.Errorf("%w: invalid field number %d at byte %d", errDecode, num, r.off)
	}
	r.advance(n)
	return protowire.Number(v >> 3), protowire.Type(v & 7), nil
}

// varint reads a varint field's value.
func (r *reader) varint() (uint64, error) {
	v, n := protowire.ConsumeVarint(r.b)
	if n < 0 {
		return 0, r.errorAt(n)
	}
	r.advance(n)
	return v, nil
}

// bytes reads a length-delimited field's value, and its offset in the
// whole request.
func (r *reader) bytes() ([]byte, int, error) {
	v, n := protowire.ConsumeBytes(r.b)
	if n < 0 {
		return nil, 0, r.errorAt(n)
	}
	off := r.off + n - len(v)
	r.advance(n)
	return v, off, nil
}

// message reads an embedded message field: a reader of its fields.
func (r *reader) message() (reader, error) {
	v, off, err := r.bytes()
	return reader{b: v, off: off}, err
}

// skip skips the value of a field of number num and type typ, a group
// with all it holds; an end of group that no group started is an error.
func (r *reader) skip(num protowire.Number, typ protowire.Type) error {
	n := protowire.ConsumeFieldValue(num, typ, r.b)
	if n < 0 {
		return r.errorAt(n)
	}
	r.advance(n)
	return nil
}

// wrapped reads a wrapper message (google.protobuf.UInt64Value,
// UInt32Value) from r: its value, or prev when it has none, as a wrapper
// that appears twice merges.
func (r reader) wrapped(prev uint64) (uint64, error) {
	v := prev
	for len(r.b) > 0 {
		num, typ, err := r.tag()
		if err != nil {
			return 0, err
		}
		if num == 1 && typ == protowire.VarintType {
			v, err = r.varint()
		} else {
			err = r.skip(num, typ)
		}
		if err != nil {
			return 0, err
		}
	}
	return v, nil
}

// errorAt is the error of protowire's code n at r's offset.
func (r *reader) errorAt(n int) error {
	return fmt.Errorf("%w: %w at byte %d", errDecode, protowire.ParseError(n), r.off)
}
