package deploy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"quotad/policy"
)

// envoyFilter is Istio's networking.istio.io/v1alpha3 EnvoyFilter, reduced
// to the fields quotad's manifests use: the strict decode refuses any
// other, as it would a typo. Each patch's value is decoded strictly into
// the go-control-plane type its applyTo names.
type envoyFilter struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Metadata   metadata `json:"metadata"`
	Spec       struct {
		WorkloadSelector struct {
			Labels map[string]string `json:"labels"`
		} `json:"workloadSelector"`
		ConfigPatches []struct {
			ApplyTo string `json:"applyTo"`
			Match   struct {
				Context  string `json:"context"`
				Listener *struct {
					FilterChain struct {
						Filter struct {
							Name      string `json:"name"`
							SubFilter struct {
								Name string `json:"name"`
							} `json:"subFilter"`
						} `json:"filter"`
					} `json:"filterChain"`
				} `json:"listener,omitempty"`
				RouteConfiguration *struct {
					Vhost struct {
						Name string `json:"name"`
					} `json:"vhost"`
				} `json:"routeConfiguration,omitempty"`
			} `json:"match"`
			Patch struct {
				Operation string          `json:"operation"`
				Value     json.RawMessage `json:"value"`
			} `json:"patch"`
		} `json:"configPatches"`
	} `json:"spec"`
}

// rlsConfig is the rate limit service a rendered sidecar serves: its
// socket and the descriptors file it loads.
type rlsConfig struct {
	socket      string
	descriptors []byte
}

// checkRLSPod: the sidecar serves the rate limit service on a second
// socket in the socket directory it shares with the pod, with descriptors
// from a mounted ConfigMap.
func checkRLSPod(t *testing.T, where string, spec *corev1.PodSpec, q *corev1.Container, r *rendered) rlsConfig {
	t.Helper()
	sock, rls := env(q, "QUOTAD_SOCKET"), env(q, "QUOTAD_RLS_SOCKET")
	if sock == nil || rls == nil {
		t.Fatalf("%s: QUOTAD_SOCKET %v, QUOTAD_RLS_SOCKET %v; want both", where, sock, rls)
	}
	if filepath.Dir(rls.Value) != filepath.Dir(sock.Value) || rls.Value == sock.Value {
		t.Errorf("%s: QUOTAD_RLS_SOCKET %s is not a second socket beside QUOTAD_SOCKET %s, in the shared emptyDir", where, rls.Value, sock.Value)
	}
	cfg := env(q, "QUOTAD_RLS_CONFIG")
	if cfg == nil {
		t.Fatalf("%s: no QUOTAD_RLS_CONFIG", where)
	}
	for _, v := range spec.Volumes {
		m := mount(q, v.Name)
		if v.ConfigMap == nil || m == nil || m.MountPath != filepath.Dir(cfg.Value) {
			continue
		}
		cm := r.configMaps[v.ConfigMap.Name]
		if cm == nil {
			t.Fatalf("%s: volume %s names ConfigMap %s, which is not rendered", where, v.Name, v.ConfigMap.Name)
		}
		data, ok := cm.Data[filepath.Base(cfg.Value)]
		if !ok {
			t.Fatalf("%s: QUOTAD_RLS_CONFIG %s: ConfigMap %s has no key %s", where, cfg.Value, cm.Name, filepath.Base(cfg.Value))
		}
		return rlsConfig{socket: rls.Value, descriptors: []byte(data)}
	}
	t.Fatalf("%s: QUOTAD_RLS_CONFIG %s is not in a mounted ConfigMap", where, cfg.Value)
	return rlsConfig{}
}

// checkNoRLS: the rate limit service is off unless asked for.
func checkNoRLS(t *testing.T, where string, q *corev1.Container) {
	t.Helper()
	for _, e := range q.Env {
		if strings.HasPrefix(e.Name, "QUOTAD_RLS_") {
			t.Errorf("%s: %s is set, but the rate limit service was not asked for", where, e.Name)
		}
	}
}

// checkEnvoyFilter: the EnvoyFilter selects the pod, istio-proxy mounts
// the socket's volume, and its patches add the filter, the cluster on the
// sidecar's socket and actions whose descriptors meet limits of the
// sidecar's descriptors file.
func checkEnvoyFilter(t *testing.T, where string, ef *envoyFilter, tmpl *corev1.PodTemplateSpec, q *corev1.Container, r *rendered, rls rlsConfig) envoyAsks {
	t.Helper()
	if !mapsSubset(ef.Spec.WorkloadSelector.Labels, tmpl.Labels) {
		t.Errorf("%s: EnvoyFilter %s selects %v, not the pods (%v)", where, ef.Metadata.Name, ef.Spec.WorkloadSelector.Labels, tmpl.Labels)
	}
	// Istio's injector mounts the volumes of this annotation into
	// istio-proxy.
	var mounts map[string]struct {
		MountPath string `json:"mountPath"`
		ReadOnly  bool   `json:"readOnly"`
	}
	ann := tmpl.Annotations["sidecar.istio.io/userVolumeMount"]
	dec := json.NewDecoder(strings.NewReader(ann))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&mounts); err != nil {
		t.Fatalf("%s: annotation sidecar.istio.io/userVolumeMount %q: %v", where, ann, err)
	}
	dir := filepath.Dir(rls.socket)
	shared := ""
	for _, v := range tmpl.Spec.Volumes {
		if m, ok := mounts[v.Name]; ok && m.MountPath == dir && v.EmptyDir != nil {
			shared = v.Name
		}
	}
	if shared == "" {
		t.Errorf("%s: istio-proxy mounts %v, not the emptyDir of %s", where, mounts, dir)
	}

	var socket, domain string
	var ds [][]entry
	var filter, cluster, vhost int
	for i, p := range ef.Spec.ConfigPatches {
		at := where + " " + ef.Metadata.Name + " configPatches[" + p.ApplyTo + "]"
		switch p.ApplyTo {
		case "HTTP_FILTER":
			filter++
			l := p.Match.Listener
			if p.Match.Context != "SIDECAR_INBOUND" || l == nil || l.FilterChain.Filter.Name != "envoy.filters.network.http_connection_manager" ||
				l.FilterChain.Filter.SubFilter.Name != "envoy.filters.http.router" || p.Patch.Operation != "INSERT_BEFORE" {
				t.Errorf("%s: want the filter inserted before the router of the inbound HTTP connection managers", at)
			}
			f := &hcmv3.HttpFilter{}
			decodeEnvoy(t, at, p.Patch.Value, f)
			domain = checkRateLimitFilter(t, at, f).Domain
		case "CLUSTER":
			cluster++
			c := &clusterv3.Cluster{}
			decodeEnvoy(t, at, p.Patch.Value, c)
			if c.Name != rlsCluster || p.Patch.Operation != "ADD" {
				t.Errorf("%s: want cluster %s added, got %s %s", at, rlsCluster, p.Patch.Operation, c.Name)
			}
			socket = checkRLSCluster(t, at, c)
		case "VIRTUAL_HOST":
			vhost++
			if p.Match.Context != "SIDECAR_INBOUND" || p.Match.RouteConfiguration == nil || p.Patch.Operation != "MERGE" {
				t.Errorf("%s: want a MERGE into an inbound virtual host", at)
			}
			// A MERGE patch is part of a virtual host: the strict decode
			// refuses unknown fields, and each RateLimit is validated
			// whole by descriptorsOf.
			vh := &routev3.VirtualHost{}
			if err := envoyJSON(p.Patch.Value, vh); err != nil {
				t.Fatalf("%s: %v", at, err)
			}
			ds = append(ds, descriptorsOf(t, at, vh.RateLimits)...)
		default:
			t.Errorf("%s: configPatches[%d] applies to %s, unknown to this test", where, i, p.ApplyTo)
		}
	}
	if filter != 1 || cluster != 1 || vhost != 1 {
		t.Fatalf("%s: %d filter, %d cluster, %d virtual host patches; want one of each", where, filter, cluster, vhost)
	}
	if socket != rls.socket {
		t.Errorf("%s: istio-proxy dials %s, the sidecar serves %s", where, socket, rls.socket)
	}
	checkDescriptorsMatch(t, where, "QUOTAD_RLS_CONFIG", rls.descriptors, domain, ds, func(name string) bool {
		_, ok := policies(t, where, &tmpl.Spec, q, r).Policies[name]
		return ok
	})
	return envoyAsks{domain: domain, descriptors: ds}
}

// envoyAsks is what an Envoy configuration sends the rate limit service:
// its domain, and the descriptors of its actions.
type envoyAsks struct {
	domain      string
	descriptors [][]entry
}

// sharedSubject is the subject runSidecar's take of the app's first policy
// uses: the user of the rate limit service's request below.
const sharedSubject = "render-test"

// askRLS returns a check for runSidecar: the sidecar's rate limit service
// answers, on the socket the Envoy dials, the request Envoy's actions make
// for the user sharedSubject; the descriptor decided by the policy api
// counts in the window the app's take counted in.
func askRLS(t *testing.T, where string, rls rlsConfig, asks envoyAsks, api *policy.Policy) func(func(string) string) {
	return func(path func(string) string) {
		t.Helper()
		cc, err := grpc.NewClient("unix://"+path(rls.socket), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		defer cc.Close()
		req := &rlsv3.RateLimitRequest{Domain: asks.domain}
		user := -1
		for i, d := range asks.descriptors {
			desc := &ratelimitv3.RateLimitDescriptor{}
			for _, e := range d {
				v := cmpOr(e.value, sampleValues[e.key])
				if e.key == "user" {
					v, user = sharedSubject, i
				}
				desc.Entries = append(desc.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: e.key, Value: v})
			}
			req.Descriptors = append(req.Descriptors, desc)
		}
		if user < 0 {
			t.Fatalf("%s: no descriptor of the actions has a user", where)
		}
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		resp, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatalf("%s: ShouldRateLimit on %s: %v", where, rls.socket, err)
		}
		st := resp.GetStatuses()
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || len(st) != len(req.Descriptors) {
			t.Fatalf("%s: ShouldRateLimit answered %v; want OK with a status per descriptor", where, resp)
		}
		// The app's take counted 1, this request 1 more, in one window.
		if got := st[user].GetCurrentLimit().GetRequestsPerUnit(); int64(got) != api.Limit || int64(st[user].LimitRemaining) != api.Limit-2 {
			t.Errorf("%s: the user's status %v; want policy api's limit %d with %d remaining, the app's take and this request counted together",
				where, st[user], api.Limit, api.Limit-2)
		}
	}
}

func TestKustomizeRLSComponents(t *testing.T) {
	// Off unless asked for.
	plain := kustomize(t, filepath.Join(dir, "examples", "existing-app"))
	checkNoRLS(t, "examples/existing-app", checkSidecarPod(t, "examples/existing-app", &plain.deployments["web"].Spec.Template.Spec, plain))
	if len(plain.filters) != 0 {
		t.Errorf("examples/existing-app renders EnvoyFilters: %v", plain.filters)
	}

	overlay := filepath.Join(dir, "examples", "istio")
	r := kustomize(t, overlay)
	web := r.deployments["web"]
	if web == nil || len(r.deployments) != 1 || len(r.filters) != 1 {
		t.Fatalf("%s: want the Deployment web and one EnvoyFilter, got %v and %v", overlay, r.deployments, r.filters)
	}
	spec := &web.Spec.Template.Spec
	q := checkSidecarPod(t, overlay, spec, r)
	checkDoctor(t, overlay, q, r)
	rls := checkRLSPod(t, overlay, spec, q, r)
	if rls.socket != rlsSocket {
		t.Errorf("%s: QUOTAD_RLS_SOCKET %s; deploy/envoy/envoy.yaml dials %s", overlay, rls.socket, rlsSocket)
	}
	var asks envoyAsks
	for _, ef := range r.filters {
		asks = checkEnvoyFilter(t, overlay, ef, &web.Spec.Template, q, r, rls)
	}
	// The Component's descriptors are deploy/envoy's, which envoy.yaml's
	// actions were checked against.
	want, err := os.ReadFile(envoyDescriptors)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(rls.descriptors, want) {
		t.Errorf("ConfigMap quotad-rls of components/quotad-rls differs from %s: copy it again", envoyDescriptors)
	}
	runSidecar(t, overlay, spec, q, r, askRLS(t, overlay, rls, asks, policies(t, overlay, spec, q, r).Policies["api"]))
}

func TestHelmRLS(t *testing.T) {
	helm := tool(t, "helm", helmPkg)
	chart := filepath.Join("helm", "quotad")
	on := []string{"--set", "example.enabled=true,rls.enabled=true,rls.istio.enabled=true"}
	runTool(t, helm, append([]string{"lint", "--strict", chart}, on...)...)
	for _, bad := range []string{"rls.socketName=a/b.sock", "rls.enabled=yes", "rls.istio.port=0", "rls.istio.timeout=100ms", "rls.sockets=x"} {
		out, err := exec.Command(helm, "template", "quotad", chart, "--kube-version", kubeVersion, "--set", bad).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "schema") {
			t.Errorf("helm template --set %s: %v\n%s; want a schema error", bad, err, out)
		}
	}

	// Off by default: no second socket, no EnvoyFilter, no annotation.
	def := helmTemplate(t, "--set", "example.enabled=true")
	d := def.deployments["quotad-example"]
	checkNoRLS(t, "helm defaults", checkSidecarPod(t, "helm defaults", &d.Spec.Template.Spec, def))
	if len(def.filters) != 0 || def.configMaps["quotad-rls"] != nil || len(d.Spec.Template.Annotations) != 1 {
		t.Errorf("helm defaults: EnvoyFilters %v, ConfigMap quotad-rls %v, annotations %v; want none of the rate limit service's",
			def.filters, def.configMaps["quotad-rls"] != nil, d.Spec.Template.Annotations)
	}
	// The service without Istio: no EnvoyFilter, no annotation.
	plain := helmTemplate(t, "--set", "example.enabled=true,rls.enabled=true")
	if len(plain.filters) != 0 || plain.deployments["quotad-example"].Spec.Template.Annotations["sidecar.istio.io/userVolumeMount"] != "" {
		t.Errorf("rls.enabled without rls.istio.enabled renders Istio's parts")
	}

	r := helmTemplate(t, on...)
	d = r.deployments["quotad-example"]
	if d == nil || len(r.filters) != 1 {
		t.Fatalf("helm %v: Deployments %v, EnvoyFilters %v", on, r.deployments, r.filters)
	}
	spec := &d.Spec.Template.Spec
	q := checkSidecarPod(t, "helm rls", spec, r)
	checkDoctor(t, "helm rls", q, r)
	rls := checkRLSPod(t, "helm rls", spec, q, r)
	var asks envoyAsks
	for _, ef := range r.filters {
		asks = checkEnvoyFilter(t, "helm rls", ef, &d.Spec.Template, q, r, rls)
	}
	// The chart's default descriptors are deploy/envoy's, without its
	// header comment.
	want, err := os.ReadFile(envoyDescriptors)
	if err != nil {
		t.Fatal(err)
	}
	var a, b any
	if err := yaml.Unmarshal(rls.descriptors, &a); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(want, &b); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Errorf("the chart's rls.config differs from %s: copy it again", envoyDescriptors)
	}
	// Another port and socket name reach the EnvoyFilter.
	moved := helmTemplate(t, append(on, "--set", "rls.socketName=envoy.sock,rls.istio.port=9000")...)
	md := moved.deployments["quotad-example"]
	mq := checkSidecarPod(t, "helm rls moved", &md.Spec.Template.Spec, moved)
	mrls := checkRLSPod(t, "helm rls moved", &md.Spec.Template.Spec, mq, moved)
	if mrls.socket != "/run/quotad/envoy.sock" {
		t.Errorf("rls.socketName=envoy.sock: QUOTAD_RLS_SOCKET %s", mrls.socket)
	}
	for _, ef := range moved.filters {
		checkEnvoyFilter(t, "helm rls moved", ef, &md.Spec.Template, mq, moved, mrls)
		for _, p := range ef.Spec.ConfigPatches {
			if p.ApplyTo == "VIRTUAL_HOST" && p.Match.RouteConfiguration.Vhost.Name != "inbound|http|9000" {
				t.Errorf("rls.istio.port=9000: the actions go to %s", p.Match.RouteConfiguration.Vhost.Name)
			}
		}
	}
	runSidecar(t, "helm rls", spec, q, r, askRLS(t, "helm rls", rls, asks, policies(t, "helm rls", spec, q, r).Policies["api"]))
}

// A chart of a user's own (deploy/helm/examples/web) turns the service and
// Istio's part on through its quotad values: the named templates give its
// pods the label the EnvoyFilter selects and the annotation that mounts
// the socket into istio-proxy.
func TestHelmRLSInAnotherChart(t *testing.T) {
	helm := tool(t, "helm", helmPkg)
	web := filepath.Join(t.TempDir(), "web")
	if err := os.CopyFS(web, os.DirFS(filepath.Join("helm", "examples", "web"))); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(filepath.Join(web, "charts", "quotad"), os.DirFS(filepath.Join("helm", "quotad"))); err != nil {
		t.Fatal(err)
	}
	set := []string{"--set", "quotad.rls.enabled=true,quotad.rls.istio.enabled=true"}
	runTool(t, helm, append([]string{"lint", "--strict", web}, set...)...)
	r := decodeAll(t, "helm template examples/web", runTool(t, helm, append([]string{"template", "web", web, "--kube-version", kubeVersion}, set...)...))
	d := r.deployments["web"]
	if d == nil || len(r.filters) != 1 {
		t.Fatalf("want the Deployment web and one EnvoyFilter: %v, %v", r.deployments, r.filters)
	}
	spec := &d.Spec.Template.Spec
	q := checkSidecarPod(t, "examples/web rls", spec, r)
	rls := checkRLSPod(t, "examples/web rls", spec, q, r)
	for _, ef := range r.filters {
		checkEnvoyFilter(t, "examples/web rls", ef, &d.Spec.Template, q, r, rls)
	}
}
