package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	dockerconfig "github.com/docker/cli/cli/config"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"

	v1 "github.com/forkbox/forkbox/api/v1"
)

// RegistryAuth is a registry credential (see v1.RegistryAuth).
type RegistryAuth = v1.RegistryAuth

// PullOptions are the options of a template pull (PullTemplate).
type PullOptions struct {
	// Platform picks the image of a multi-platform index ("linux/arm64");
	// "" the daemon host's.
	Platform string
	// InsecureRegistries are registries (host or host:port) the daemon
	// may use plain HTTP with; loopback names always may.
	InsecureRegistries []string
	// Auth is the registry credential (nil: anonymous); see
	// RegistryAuthFor for one from a docker config.
	Auth *RegistryAuth
	// StartCmd keeps the image's ENTRYPOINT and CMD as the template's
	// start command.
	StartCmd bool
	// Shared makes the template every tenant's (admin keys only).
	Shared bool
	// Progress, when not nil, gets the pull's events as the daemon sends
	// them (the pull is then streamed).
	Progress func(PullEvent)
}

// PullEvent is one event of a streamed pull: Kind is "resolved", "layer"
// or "unpacking" (see v1.PullEvent).
type PullEvent struct {
	Kind string
	v1.PullEvent
}

// PullTemplate makes template name from the image ref names in its
// registry ("registry.example/library/python:3.12"), pulled by the
// daemon, as o says. The credential in o goes to the daemon for this pull
// only.
func (c *Client) PullTemplate(ctx context.Context, tplName, ref string, o PullOptions) (*Template, error) {
	if err := checkID("template", tplName); err != nil {
		return nil, err
	}
	in := v1.TemplatePullRequest{Ref: ref, Platform: o.Platform, InsecureRegistries: o.InsecureRegistries,
		Auth: o.Auth, StartCmd: o.StartCmd, Shared: o.Shared}
	path := "/v1/templates/" + url.PathEscape(tplName)
	if o.Progress == nil {
		t := &Template{}
		_, err := c.doJSON(ctx, http.MethodPut, path, nil, nil, in, t)
		return t, err
	}
	body, err := json.Marshal(in)
	if err != nil {
		return nil, err
	}
	req := request{method: http.MethodPut, path: path, body: strings.NewReader(string(body)), size: int64(len(body)),
		contentType: "application/json"}
	req.accept = "text/event-stream"
	resp, err := c.do(ctx, req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t := &Template{}
		return t, decodeBody(resp, t)
	}
	var t *Template
	err = readEvents(resp.Body, func(event, data string) error {
		switch event {
		case "template":
			t = &Template{}
			return json.Unmarshal([]byte(data), t)
		case "error":
			e := &Error{}
			if err := json.Unmarshal([]byte(data), e); err != nil {
				return fmt.Errorf("pull failed: %s", data)
			}
			return e
		default:
			ev := PullEvent{Kind: event}
			if err := json.Unmarshal([]byte(data), &ev.PullEvent); err != nil {
				return fmt.Errorf("bad %s event: %w", event, err)
			}
			o.Progress(ev)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if t == nil {
		return nil, fmt.Errorf("pull stream ended without a template")
	}
	return t, nil
}

// RegistryAuthFor returns the credential a docker config holds for the
// registry of image ref (nil when it holds none: anonymous): the config
// directory configDir (holding config.json, as `docker --config`), or
// with configDir "" the default keychain's (DOCKER_CONFIG, else
// ~/.docker/config.json, else podman's auth.json). Credential helpers
// and credsStore the config names are run as docker runs them.
func RegistryAuthFor(ref, configDir string) (*RegistryAuth, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("image reference %q: %w", ref, err)
	}
	var kc authn.Keychain = authn.DefaultKeychain
	if configDir != "" {
		kc = configDirKeychain(configDir)
	}
	a, err := kc.Resolve(r.Context())
	if err != nil {
		return nil, fmt.Errorf("registry credentials for %s: %w", r.Context().RegistryStr(), err)
	}
	if a == authn.Anonymous {
		return nil, nil
	}
	cfg, err := a.Authorization()
	if err != nil {
		return nil, fmt.Errorf("registry credentials for %s: %w", r.Context().RegistryStr(), err)
	}
	if *cfg == (authn.AuthConfig{}) {
		return nil, nil
	}
	return &RegistryAuth{Username: cfg.Username, Password: cfg.Password, Auth: cfg.Auth,
		IdentityToken: cfg.IdentityToken, RegistryToken: cfg.RegistryToken}, nil
}

// configDirKeychain resolves credentials from the docker config in a
// directory.
type configDirKeychain string

// Resolve looks target up as docker does: the repository, then the
// registry (Docker Hub under its historical key).
func (dir configDirKeychain) Resolve(target authn.Resource) (authn.Authenticator, error) {
	cf, err := dockerconfig.Load(string(dir))
	if err != nil {
		return nil, err
	}
	for _, key := range []string{target.String(), target.RegistryStr()} {
		if key == name.DefaultRegistry {
			key = authn.DefaultAuthKey
		}
		ac, err := cf.GetAuthConfig(key)
		if err != nil {
			return nil, err
		}
		if ac.Username != "" || ac.Password != "" || ac.Auth != "" || ac.IdentityToken != "" || ac.RegistryToken != "" {
			return authn.FromConfig(authn.AuthConfig{Username: ac.Username, Password: ac.Password, Auth: ac.Auth,
				IdentityToken: ac.IdentityToken, RegistryToken: ac.RegistryToken}), nil
		}
	}
	return authn.Anonymous, nil
}
