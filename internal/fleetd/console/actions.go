package console

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/internal/fleetd/roles"
)

// maxReason bounds the reason an action records.
const maxReason = 500

type confirmView struct {
	ID     string
	Action action
	// May is false when the console's role may not take the action: the
	// page says so and shows no form.
	May    bool
	Needed string
	Back   string
	CSRF   string
}

// confirmPage asks for confirmation (and a reason) before an action.
func (c *Console) confirmPage(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	a, ok := actions[r.URL.Query().Get("action")]
	if !ok {
		c.render(w, http.StatusNotFound, s, "message", "Not found", "", "There is no such action.")
		return
	}
	v := confirmView{ID: id, Action: a, May: c.may(a.Name), Back: "/nodes/" + url.PathEscape(id), CSRF: s.csrf}
	if a.Name == "approve" {
		v.Back = "/pending"
	}
	if !v.May {
		var need []string
		for _, r := range roles.Needed(actionNeeds[a.Name]) {
			need = append(need, string(r))
		}
		v.Needed = strings.Join(need, " or ")
	}
	c.render(w, http.StatusOK, s, "confirm", a.Label+" "+id, "fleet", v)
}

// nodeAction carries out a confirmed action through the Admin API, which
// checks the credential's role: the console does not decide.
func (c *Console) nodeAction(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	name := r.PostForm.Get("action")
	reason := strings.TrimSpace(r.PostForm.Get("reason"))
	a, ok := actions[name]
	if !ok {
		c.refuse(w, r, reasonForm, http.StatusBadRequest, "There is no such action.")
		return
	}
	if name != "approve" && reason == "" {
		c.refuse(w, r, reasonForm, http.StatusBadRequest, "An action needs a reason: go back and write why.")
		return
	}
	if len(reason) > maxReason || !utf8.ValidString(reason) {
		c.refuse(w, r, reasonForm, http.StatusBadRequest, fmt.Sprintf("The reason is longer than %d bytes or not UTF-8: shorten it.", maxReason))
		return
	}
	ctx, cancel := callCtx(r)
	defer cancel()
	var (
		msg  string
		err  error
		back = "/nodes/" + url.PathEscape(id)
	)
	switch name {
	case "approve":
		var resp *adminv1.ApproveNodeResponse
		if resp, err = c.cfg.Admin.ApproveNode(ctx, &adminv1.ApproveNodeRequest{Id: id}); err == nil {
			msg = fmt.Sprintf("Approved %d pending join(s) of %s.", resp.Approved, id)
			back = "/pending"
		}
	case "revoke":
		var resp *adminv1.RevokeNodeResponse
		if resp, err = c.cfg.Admin.RevokeNode(ctx, &adminv1.RevokeNodeRequest{Id: id, Reason: reason}); err == nil {
			msg = fmt.Sprintf("Node %s revoked: identity generation %d, %d certificate(s) revoked, live session notified: %t.", id, resp.IdentityGeneration, len(resp.RevokedSerials), resp.SessionNotified)
		}
	default:
		var resp *adminv1.TransitionNodeResponse
		if resp, err = c.cfg.Admin.TransitionNode(ctx, &adminv1.TransitionNodeRequest{Id: id, Action: name, Reason: reason}); err == nil {
			msg = fmt.Sprintf("Node %s is %s.", id, resp.Node.GetState())
			if len(resp.Warnings) > 0 {
				msg += " Warnings: " + strings.Join(resp.Warnings, "; ")
			}
		}
	}
	if err != nil {
		c.log.WarnContext(r.Context(), "console action refused by the control plane", "action", a.Name, "node_id", id, "error", err)
		c.apiError(w, s, strings.ToLower(a.Label)+" "+id, err)
		return
	}
	c.log.InfoContext(r.Context(), "console action", "action", a.Name, "node_id", id, "credential", c.cfg.Credential)
	c.auth.setFlash(s, msg)
	http.Redirect(w, r, back, http.StatusSeeOther)
}
