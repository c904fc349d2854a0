package deploy_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protopath"
	"google.golang.org/protobuf/reflect/protorange"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"
)

// The Envoy configuration of deploy/envoy: a bootstrap that asks quotad's
// rate limit service on its Unix socket, and the descriptors it decides.
var (
	envoyBootstrap   = filepath.Join("envoy", "envoy.yaml")
	envoyDescriptors = filepath.Join("envoy", "ratelimit.yaml")
)

// rlsCluster is the cluster name of quotad's rate limit service in the
// bootstrap and the EnvoyFilter.
const rlsCluster = "quotad_rls"

// rlsSocket is where every example puts quotad's rate limit service: in
// the socket directory the pod's containers share.
const rlsSocket = "/run/quotad/rls.sock"

// decodeEnvoy decodes Envoy's YAML into m as Envoy would refuse it: an
// unknown field fails protojson (DiscardUnknown false), a typed config's
// @type must be known to the registry (the imports above register the
// extensions the files use), and every message, those inside an Any
// included, passes its protoc-gen-validate rules.
func decodeEnvoy(t *testing.T, where string, data []byte, m proto.Message) {
	t.Helper()
	if err := envoyStrict(data, m); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
}

func envoyStrict(data []byte, m proto.Message) error {
	if err := envoyJSON(data, m); err != nil {
		return err
	}
	return validateEnvoy(m)
}

// envoyJSON decodes YAML (or JSON) into m with protojson, refusing unknown
// fields and typed configs of unknown types, without validating.
func envoyJSON(data []byte, m proto.Message) error {
	j, err := yaml.YAMLToJSON(data)
	if err != nil {
		return err
	}
	return protojson.UnmarshalOptions{DiscardUnknown: false}.Unmarshal(j, m)
}

// validateEnvoy runs the generated ValidateAll of m and of every message an
// Any within it holds.
func validateEnvoy(m proto.Message) error {
	if v, ok := m.(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			return err
		}
	}
	var errs []error
	_ = protorange.Range(m.ProtoReflect(), func(p protopath.Values) error {
		msg, ok := p.Index(-1).Value.Interface().(protoreflect.Message)
		if !ok || msg.Descriptor().FullName() != "google.protobuf.Any" {
			return nil
		}
		a := msg.Interface().(*anypb.Any)
		inner, err := a.UnmarshalNew()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p.Path, err))
			return nil
		}
		if err := validateEnvoy(inner); err != nil {
			errs = append(errs, fmt.Errorf("%s (%s): %w", p.Path, a.TypeUrl, err))
		}
		return nil
	})
	return errors.Join(errs...)
}

// unpack returns the message of a typed config, which decodeEnvoy has
// already resolved.
func unpack[M proto.Message](t *testing.T, where string, a *anypb.Any, into M) M {
	t.Helper()
	if a == nil {
		t.Fatalf("%s: no typed_config", where)
	}
	if err := a.UnmarshalTo(into); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	return into
}

// checkRLSCluster: the cluster reaches one Unix socket over HTTP/2, as gRPC
// needs; it returns the socket's path.
func checkRLSCluster(t *testing.T, where string, c *clusterv3.Cluster) string {
	t.Helper()
	if c.GetType() != clusterv3.Cluster_STATIC {
		t.Errorf("%s: cluster %s is %v, want STATIC (a socket path needs no resolving)", where, c.Name, c.GetType())
	}
	opts := &upstreamhttpv3.HttpProtocolOptions{}
	unpack(t, where+" HttpProtocolOptions", c.TypedExtensionProtocolOptions["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"], opts)
	if opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
		t.Errorf("%s: cluster %s does not speak HTTP/2, which gRPC needs", where, c.Name)
	}
	eps := c.GetLoadAssignment().GetEndpoints()
	if len(eps) != 1 || len(eps[0].LbEndpoints) != 1 {
		t.Fatalf("%s: cluster %s wants one endpoint, has %v", where, c.Name, eps)
	}
	pipe := eps[0].LbEndpoints[0].GetEndpoint().GetAddress().GetPipe()
	if pipe == nil || !filepath.IsAbs(pipe.Path) {
		t.Fatalf("%s: cluster %s's endpoint is not a pipe address with an absolute path", where, c.Name)
	}
	return pipe.Path
}

// checkRateLimitFilter: the filter asks the cluster over the v3 API; it
// returns the filter's config.
func checkRateLimitFilter(t *testing.T, where string, f *hcmv3.HttpFilter) *ratelimitv3.RateLimit {
	t.Helper()
	if f.Name != "envoy.filters.http.ratelimit" {
		t.Fatalf("%s: filter %s, want envoy.filters.http.ratelimit", where, f.Name)
	}
	rl := unpack(t, where, f.GetTypedConfig(), &ratelimitv3.RateLimit{})
	svc := rl.GetRateLimitService()
	if svc.GetTransportApiVersion() != corev3.ApiVersion_V3 {
		t.Errorf("%s: transport_api_version %v, want V3", where, svc.GetTransportApiVersion())
	}
	if got := svc.GetGrpcService().GetEnvoyGrpc().GetClusterName(); got != rlsCluster {
		t.Errorf("%s: the rate limit service is cluster %q, want %s", where, got, rlsCluster)
	}
	if rl.Domain == "" {
		t.Errorf("%s: no domain", where)
	}
	return rl
}

// entry is one entry of a descriptor an action produces: its key, and its
// value when the action fixes it ("" when the request decides it).
type entry struct{ key, value string }

// descriptorsOf returns the descriptor each rate_limits item produces, for
// the actions quotad's examples use; any other action fails the test, so
// that a new one is checked before it is shipped.
func descriptorsOf(t *testing.T, where string, rls []*routev3.RateLimit) [][]entry {
	t.Helper()
	var out [][]entry
	for i, rl := range rls {
		if err := rl.ValidateAll(); err != nil {
			t.Fatalf("%s: rate_limits[%d]: %v", where, i, err)
		}
		var d []entry
		for _, a := range rl.Actions {
			switch a := a.ActionSpecifier.(type) {
			case *routev3.RateLimit_Action_RemoteAddress_:
				d = append(d, entry{key: "remote_address"})
			case *routev3.RateLimit_Action_GenericKey_:
				d = append(d, entry{key: cmpOr(a.GenericKey.DescriptorKey, "generic_key"), value: a.GenericKey.DescriptorValue})
			case *routev3.RateLimit_Action_RequestHeaders_:
				d = append(d, entry{key: a.RequestHeaders.DescriptorKey})
			case *routev3.RateLimit_Action_HeaderValueMatch_:
				d = append(d, entry{key: cmpOr(a.HeaderValueMatch.DescriptorKey, "header_match"), value: a.HeaderValueMatch.DescriptorValue})
			default:
				t.Fatalf("%s: rate_limits[%d]: action %T is not known to this test", where, i, a)
			}
		}
		out = append(out, d)
	}
	return out
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// descriptorTree is envoyproxy/ratelimit's configuration file, read
// loosely: enough to follow a descriptor down its tree.
type descriptorTree struct {
	Domain      string           `json:"domain"`
	Descriptors []descriptorNode `json:"descriptors"`
}

type descriptorNode struct {
	Key         string           `json:"key"`
	Value       string           `json:"value"`
	RateLimit   map[string]any   `json:"rate_limit"`
	Descriptors []descriptorNode `json:"descriptors"`
}

// limited says whether a descriptor reaches a node with a limit: at each
// entry, a node of its key and value, else of its key alone when the
// request decides the value.
func limited(nodes []descriptorNode, d []entry) bool {
	if len(d) == 0 {
		return false
	}
	i := slices.IndexFunc(nodes, func(n descriptorNode) bool { return n.Key == d[0].key && n.Value == d[0].value })
	if i < 0 && d[0].value != "" {
		i = slices.IndexFunc(nodes, func(n descriptorNode) bool { return n.Key == d[0].key && n.Value == "" })
	}
	if i < 0 {
		return false
	}
	if len(d) == 1 {
		return nodes[i].RateLimit != nil
	}
	return limited(nodes[i].Descriptors, d[1:])
}

// checkDescriptorsMatch: the file is of the filter's domain, and every
// descriptor the actions produce meets a limit in it.
func checkDescriptorsMatch(t *testing.T, where, file, domain string, ds [][]entry) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var tree descriptorTree
	if err := yaml.Unmarshal(data, &tree); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if tree.Domain != domain {
		t.Errorf("%s: %s has domain %q, the filter asks for %q", where, file, tree.Domain, domain)
	}
	if len(ds) == 0 {
		t.Errorf("%s: no rate_limits actions", where)
	}
	for _, d := range ds {
		if !limited(tree.Descriptors, d) {
			t.Errorf("%s: the descriptor %v meets no limit of %s", where, d, file)
		}
	}
}

func TestEnvoyBootstrapDecodesStrictly(t *testing.T) {
	data, err := os.ReadFile(envoyBootstrap)
	if err != nil {
		t.Fatal(err)
	}
	b := &bootstrapv3.Bootstrap{}
	decodeEnvoy(t, envoyBootstrap, data, b)

	var socket string
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.Name == rlsCluster {
			socket = checkRLSCluster(t, envoyBootstrap, c)
		}
	}
	if socket == "" {
		t.Fatalf("%s: no cluster %s", envoyBootstrap, rlsCluster)
	}
	if socket != rlsSocket {
		t.Errorf("%s: the socket is %s; the manifests put it at %s", envoyBootstrap, socket, rlsSocket)
	}

	ls := b.GetStaticResources().GetListeners()
	if len(ls) != 1 || len(ls[0].FilterChains) != 1 || len(ls[0].FilterChains[0].Filters) != 1 {
		t.Fatalf("%s: want one listener with one HTTP connection manager", envoyBootstrap)
	}
	hcm := unpack(t, envoyBootstrap, ls[0].FilterChains[0].Filters[0].GetTypedConfig(), &hcmv3.HttpConnectionManager{})
	fs := hcm.HttpFilters
	if len(fs) != 2 || fs[1].Name != "envoy.filters.http.router" {
		t.Fatalf("%s: want the rate limit filter, then the router", envoyBootstrap)
	}
	rl := checkRateLimitFilter(t, envoyBootstrap, fs[0])
	if rl.FailureModeDeny {
		t.Errorf("%s: failure_mode_deny is true; the example fails open, as its comment says", envoyBootstrap)
	}
	if rl.EnableXRatelimitHeaders != ratelimitv3.RateLimit_DRAFT_VERSION_03 {
		t.Errorf("%s: enable_x_ratelimit_headers %v; quotad sends what the headers need", envoyBootstrap, rl.EnableXRatelimitHeaders)
	}
	var ds [][]entry
	for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
		ds = append(ds, descriptorsOf(t, envoyBootstrap+" virtual host "+vh.Name, vh.RateLimits)...)
		for _, r := range vh.Routes {
			ds = append(ds, descriptorsOf(t, envoyBootstrap+" route", r.GetRoute().GetRateLimits())...)
		}
	}
	if len(ds) != 2 {
		t.Errorf("%s: %d descriptors per request, want the 2 the comments describe", envoyBootstrap, len(ds))
	}
	checkDescriptorsMatch(t, envoyBootstrap, envoyDescriptors, rl.Domain, ds)
}

// The strict decode refuses what Envoy would: a typo, a typed config of an
// unknown type, a value its rules forbid.
func TestDecodeEnvoyRefusesWhatEnvoyWould(t *testing.T) {
	data, err := os.ReadFile(envoyBootstrap)
	if err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string]func(map[string]any){
		"unknown field": func(m map[string]any) { m["static_resources"].(map[string]any)["clusterz"] = []any{} },
		"unknown type": func(m map[string]any) {
			c := m["static_resources"].(map[string]any)["clusters"].([]any)[1].(map[string]any)
			c["typed_extension_protocol_options"].(map[string]any)["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"].(map[string]any)["@type"] = "type.googleapis.com/quotad.NoSuchOptions"
		},
		"bad value": func(m map[string]any) {
			c := m["static_resources"].(map[string]any)["clusters"].([]any)[1].(map[string]any)
			c["load_assignment"].(map[string]any)["endpoints"].([]any)[0].(map[string]any)["lb_endpoints"].([]any)[0].(map[string]any)["endpoint"].(map[string]any)["address"] = map[string]any{"pipe": map[string]any{"path": ""}}
		},
	} {
		var m map[string]any
		if err := yaml.Unmarshal(data, &m); err != nil {
			t.Fatal(err)
		}
		edit(m)
		j, err := yaml.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if err := envoyStrict(j, &bootstrapv3.Bootstrap{}); err == nil {
			t.Errorf("%s: the bootstrap decoded", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}
