package v1

// SecretRequest sets a secret (PUT /v1/secrets/{name} with a JSON body).
// The value may instead be the whole body (any other Content-Type), with
// the hosts as ?host= (repeated) and the header as ?header=.
type SecretRequest struct {
	// Hosts are the DNS names (or IP literals outside the always-blocked
	// ranges) the value may be sent to, over TLS on port 443 only; 1 or more.
	Hosts []string `json:"hosts"`
	// Header is an optional "Name: template" holding {value} once: the
	// broker sets that header on every request to Hosts. Empty: the
	// placeholder is replaced wherever it appears in a request header.
	Header string `json:"header,omitempty"`
	// Value is the secret, 1 byte to 64 KiB, without CR, LF or NUL. It is
	// stored sealed and never returned.
	Value string `json:"value"`
}

// Secret is a secret as the API shows it: never its value.
type Secret struct {
	// Name is the secret's name: a lower-case letter, then up to 63 of
	// a-z, 0-9, '_'. A session that asks for it has the placeholder in the
	// environment variable of the name upper-cased.
	Name   string   `json:"name"`
	Hosts  []string `json:"hosts"`
	Header string   `json:"header,omitempty"`
}

// SecretList is the body of GET /v1/secrets.
type SecretList struct {
	Secrets []Secret `json:"secrets"`
}
