package v1

// TemplatePullRequest is the JSON body of PUT /v1/templates/{name} that
// pulls the template's image from a registry (an upload sends the image
// tarball instead).
type TemplatePullRequest struct {
	// Ref names the image: "registry.example/library/python:3.12",
	// "alpine" (Docker Hub's), "host:5000/app@sha256:...".
	Ref string `json:"ref"`
	// Platform picks the image of a multi-platform index, "os/arch" or
	// "os/arch/variant"; "" the daemon host's (linux/amd64 on x86-64).
	Platform string `json:"platform,omitempty"`
	// InsecureRegistries are registries (host or host:port) the pull may
	// use plain HTTP with; loopback names always may.
	InsecureRegistries []string `json:"insecure_registries,omitempty"`
	// Auth is the registry credential (none: anonymous). It is used for
	// this pull only: never stored, logged or audited.
	Auth *RegistryAuth `json:"auth,omitempty"`
	// StartCmd keeps the image's ENTRYPOINT and CMD as the template's
	// start command.
	StartCmd bool `json:"start_cmd,omitempty"`
	// Shared makes the template every tenant's (admin keys only).
	Shared bool `json:"shared,omitempty"`
}

// RegistryAuth is a registry credential, as a docker config file holds
// one: a user name and password (or Auth, their base64
// "user:password"), or a token.
type RegistryAuth struct {
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
	// Auth is base64("username:password").
	Auth string `json:"auth,omitempty"`
	// IdentityToken is an OAuth2 refresh token the registry's token
	// service exchanges; RegistryToken a bearer token sent as it is.
	IdentityToken string `json:"identity_token,omitempty"`
	RegistryToken string `json:"registry_token,omitempty"`
}

// PullEvent is the data of an event of a pull's stream (PUT
// /v1/templates/{name} with a pull body and Accept: text/event-stream):
//
//	event: resolved   data: PullEvent (digest, platform, layers)
//	event: layer      data: PullEvent (layer: one layer's progress)
//	event: unpacking  data: PullEvent (the layers are held; they are unpacked now)
//	event: template   data: Template (the pull is done; the last event)
//	event: error      data: Problem (the pull failed after the stream began; the last event)
type PullEvent struct {
	// Digest is the manifest digest of the image picked; Platform its
	// platform ("linux/amd64").
	Digest   string `json:"digest,omitempty"`
	Platform string `json:"platform,omitempty"`
	// Layers are every layer, lowest first (resolved).
	Layers []PullLayer `json:"layers,omitempty"`
	// Layer is the layer a layer event is about.
	Layer *PullLayer `json:"layer,omitempty"`
}

// PullLayer is how far one layer of a pull is.
type PullLayer struct {
	// Index is the layer's place, 0 the lowest.
	Index int `json:"index"`
	// Digest is the compressed layer's digest, Size its size in bytes.
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
	// Done is how many bytes of it are downloaded.
	Done int64 `json:"done"`
	// Cached says the daemon's layer cache held it: nothing downloaded.
	Cached bool `json:"cached,omitempty"`
	// Complete says it is held now (downloaded and verified, or cached).
	Complete bool `json:"complete,omitempty"`
}
