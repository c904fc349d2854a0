package rls

import (
	"fmt"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"quotad/rls/descriptors"
)

// metadataOf is the response's dynamic_metadata as envoyproxy/ratelimit
// writes it when its response dynamic metadata is on: the domain, the
// request's descriptors, its hits_addend, and the metadata of the matched
// descriptors that passed, merged. nil when no descriptor that passed has
// metadata, so that a file without metadata costs nothing.
func metadataOf(req *rlsv3.RateLimitRequest, passed []*descriptors.RateLimit) *structpb.Struct {
	merged := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for _, l := range passed {
		if l.Metadata == nil {
			continue
		}
		s, err := structpb.NewStruct(l.Metadata)
		if err != nil {
			continue // descriptors decoded it to structpb's types
		}
		mergeMetadata(merged, s)
	}
	if len(merged.Fields) == 0 {
		return nil
	}
	fields := map[string]*structpb.Value{"domain": structpb.NewStringValue(req.GetDomain())}
	list := make([]*structpb.Value, 0, len(req.GetDescriptors()))
	for _, d := range req.GetDescriptors() {
		list = append(list, structpb.NewStructValue(descriptorStruct(d)))
	}
	fields["descriptors"] = structpb.NewListValue(&structpb.ListValue{Values: list})
	if h := req.GetHitsAddend(); h != 0 {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(h))
	}
	fields["metadata"] = structpb.NewStructValue(merged)
	return &structpb.Struct{Fields: fields}
}

// descriptorStruct is one request descriptor in the metadata: its entries
// as "key=value", its limit override and its hits_addend when set.
func descriptorStruct(d *ratelimitv3.RateLimitDescriptor) *structpb.Struct {
	entries := make([]*structpb.Value, 0, len(d.GetEntries()))
	for _, e := range d.GetEntries() {
		entries = append(entries, structpb.NewStringValue(fmt.Sprintf("%s=%s", e.GetKey(), e.GetValue())))
	}
	fields := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
	if l := d.GetLimit(); l != nil {
		fields["limit"] = structpb.NewStringValue(l.String())
	}
	if h := d.GetHitsAddend(); h != nil {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
	}
	return &structpb.Struct{Fields: fields}
}

// mergeMetadata merges src into dst: a key dst lacks is added, two
// structs under one key are merged, and otherwise the first value stays.
func mergeMetadata(dst, src *structpb.Struct) {
	for k, v := range src.GetFields() {
		have, ok := dst.Fields[k]
		if !ok {
			dst.Fields[k] = v
			continue
		}
		if hs, vs := have.GetStructValue(), v.GetStructValue(); hs != nil && vs != nil {
			mergeMetadata(hs, vs)
		}
	}
}
