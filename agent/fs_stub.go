package agent

import (
	"net/http"

	"github.com/forkbox/forkbox/internal/envdpb/filesystempb/filesystempbconnect"
)

// TEMPORARY placeholder until the filesystem service lands.
type filesystemService struct {
	filesystempbconnect.UnimplementedFilesystemHandler
	a *Agent
}

func newFilesystemService(a *Agent) *filesystemService { return &filesystemService{a: a} }

func (a *Agent) handleFileDownload(w http.ResponseWriter, r *http.Request) {
	http.Error(w, "not implemented", http.StatusNotImplemented)
}
func (a *Agent) handleFileUpload(w http.ResponseWriter, r *http.Request) {
	http.Error(w, "not implemented", http.StatusNotImplemented)
}
