package deploy_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
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
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"quotad/policy"
	"quotad/rls/descriptors"
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

// sampleValues stand for what a request gives an entry whose value the
// request decides.
var sampleValues = map[string]string{"remote_address": "203.0.113.7", "user": "alice"}

// checkDescriptorsMatch: the descriptors file loads, is of the filter's
// domain, and every descriptor the actions produce meets a limit in it;
// with policyExists, every quotad_policy it names exists.
func checkDescriptorsMatch(t *testing.T, where, name string, data []byte, domain string, ds [][]entry, policyExists func(string) bool) {
	t.Helper()
	cfg, err := descriptors.Parse(name, data)
	if err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	if got := cfg.Domains(); !slices.Equal(got, []string{domain}) {
		t.Errorf("%s: %s has domains %v, the filter asks for %q", where, name, got, domain)
	}
	if policyExists != nil {
		if err := cfg.MissingPolicies(policyExists); err != nil {
			t.Errorf("%s: %v", where, err)
		}
	}
	if len(ds) == 0 {
		t.Errorf("%s: no rate_limits actions", where)
	}
	for _, d := range ds {
		entries := make([]descriptors.Entry, len(d))
		for i, e := range d {
			entries[i] = descriptors.Entry{Key: e.key, Value: cmpOr(e.value, sampleValues[e.key])}
			if entries[i].Value == "" {
				t.Fatalf("%s: no sample value for the entry %s", where, e.key)
			}
		}
		if m, ok := cfg.Match(domain, entries); !ok || m.Limit == nil || m.Limit.Unlimited {
			t.Errorf("%s: the descriptor %v meets no limit of %s", where, entries, name)
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
	// The file loads as quotad serve --rls-config loads it, and its
	// quotad_policy names are policies of the manifests' policy file.
	loaded, err := descriptors.Load(envoyDescriptors)
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	cms, err := os.ReadFile(filepath.Join(dir, "components", "quotad", "configmap.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(cms), -1) {
		var c corev1.ConfigMap
		strict(t, "components/quotad/configmap.yaml", []byte(doc), &c)
		if p, ok := c.Data["policies.yaml"]; ok {
			pc, err := policy.ParseConfig([]byte(p))
			if err != nil {
				t.Fatal(err)
			}
			for n := range pc.Policies {
				known[n] = true
			}
		}
	}
	if err := loaded.MissingPolicies(func(name string) bool { return known[name] }); err != nil {
		t.Errorf("%s against the policies of components/quotad: %v", envoyDescriptors, err)
	}
	desc, err := os.ReadFile(envoyDescriptors)
	if err != nil {
		t.Fatal(err)
	}
	checkDescriptorsMatch(t, envoyBootstrap, envoyDescriptors, desc, rl.Domain, ds, nil)
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
