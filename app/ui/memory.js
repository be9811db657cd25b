// The memory page: shows and manages the caller's memory through the public /v1/me API.
//
// The token lives only in `state.token` (never in storage, a cookie or the address bar). With
// sign-in configured (/ui/config.json), the page gets it from the company's OpenID provider by the
// authorization code flow with PKCE (signin.js, shared with the admin console); only what must survive the redirect to the provider (state,
// nonce, code verifier) waits in sessionStorage, and is removed as soon as the page is back.
// A token in a link (`#token=...`) is always removed from the address bar at once, and used only
// when the page is opened with it and no company sign-in is configured (development): with
// sign-in, a link's token would sign the victim in as whoever made the link (login CSRF). A token
// that arrives in the fragment of an open page (`hashchange`) is never used, whoever is signed
// in: switching identity takes the user's own action (pasting a token, or signing in).
// Everything the service returns is put on the page as text nodes, never parsed as HTML.
"use strict";

(() => {
  // The API is the page's parent, so the page also works behind a path prefix (/ui/memory
  // under /prefix/ calls /prefix/v1/...): every path below is resolved against it.
  const API_ROOT = new URL("../", location.href);
  const PAGE_CONFIG = new URL("config.json", location.href);
  const MEMORY = "/v1/me/memory";
  const VERSIONS_PAGE = 10;
  const POLICY_ACTIONS_PAGE = 100;
  const POLICY_PROBLEM = "urn:context-memory:problem:memory-policy";
  const TRUNCATION_MARKER = "<!-- truncated to fit memory budget -->";
  const EMPTY_PLACEHOLDER = "_(empty)_";
  const FRONTMATTER_LINES = 7; // "---", four keys, "---" and a blank line
  const HUNK_HEADER = /^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@/;
  const SECTIONS = [
    "Identity",
    "Communication Preferences",
    "Work Context",
    "Skills & Expertise",
    "Recent Topics",
    "Open Questions / Follow-ups",
  ];
  const TITLE_LINE = "# User Memory";
  const NEW_PROFILE = [TITLE_LINE, ...SECTIONS.map((name) => `\n## ${name}`)].join("\n") + "\n";
  const REASONS = {
    consolidation: "Learned from your conversations",
    condensation: "Condensed to fit the memory budget",
    truncation: "Shortened to fit the memory budget",
    user_edit: "Edited by you",
    restore: "Restored from an earlier version",
    retention: "Old recent topics removed by your company's retention policy",
  };
  const STATUS_WORDS = {
    0: "The service could not be reached. Check your connection and try again.",
    400: "The request was not understood.",
    401: "Your token was not accepted: it may have expired or be mistyped. Paste a new token.",
    403: "Your token does not allow this.",
    404: "It was not found.",
    409: "It conflicts with your current settings.",
    412: "Your memory changed in the meantime.",
    413: "It is too large.",
    422: "Some of what was sent is not valid.",
    428: "The page did not say which version it changes.",
    429: "Too many requests: wait a moment and try again.",
    503: "The service is briefly unavailable: try again in a moment.",
  };
  const SIGNED_IN_401 = "Your sign-in has expired or was not accepted. Sign in again.";
  const FIELD_NAMES = { "body.content": "Your text", "query.cursor": "The page of versions" };

  const state = {
    token: null,
    me: null,
    settings: null,
    memory: null, // {content, version, tokens, updated_at, etag} or null when there is none
    policyActions: { items: [], more: false }, // what the company's memory policy kept out
    editor: { etag: null, base: "" }, // the version the text in the editor started from
    newerEtag: null, // during a conflict: the version my text would replace
    cursor: null,
  };

  const $ = (id) => document.getElementById(id);

  // --- the API ----------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, problem, response) {
      super((problem && problem.title) || `HTTP ${status}`);
      this.status = status;
      this.problem = problem;
      this.response = response;
    }
  }

  async function api(method, path, { body, headers } = {}) {
    if (!state.token) throw new ApiError(401, null, null);
    const init = {
      method,
      headers: { Authorization: `Bearer ${state.token}`, Accept: "application/json", ...headers },
      cache: "no-store",
      credentials: "omit",
      referrerPolicy: "no-referrer",
    };
    if (body !== undefined) {
      init.body = JSON.stringify(body);
      init.headers["Content-Type"] = "application/json";
    }
    let response;
    try {
      response = await fetch(new URL(path.slice(1), API_ROOT), init);
    } catch {
      throw new ApiError(0, null, null);
    }
    if (response.ok) return response;
    let problem = null;
    try {
      problem = await response.json();
    } catch {
      problem = null;
    }
    throw new ApiError(response.status, problem, response);
  }

  function etagOf(response, version) {
    return response.headers.get("ETag") || `"${version}"`;
  }

  // --- small DOM helpers (text only) --------------------------------------------------------

  function el(tag, attributes = {}, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes)) {
      if (name === "class") node.className = value;
      else node.setAttribute(name, value);
    }
    node.append(...children);
    return node;
  }

  function announce(message) {
    $("status").textContent = message;
  }

  function clearMessages() {
    const alert = $("alert");
    alert.replaceChildren();
    alert.hidden = true;
    announce("");
  }

  function showProblem(error, what) {
    if (!(error instanceof ApiError)) throw error;
    const problem = error.problem && typeof error.problem === "object" ? error.problem : {};
    const words =
      error.status === 401 && signIn.viaProvider
        ? SIGNED_IN_401
        : problem.type === POLICY_PROBLEM
          ? "Your company does not allow this in your memory. Remove these lines, or say them without the value, and save again; nothing was saved."
          : STATUS_WORDS[error.status];
    const explanation = words || problem.title || `The service answered ${error.status}.`;
    const nodes = [el("p", { class: "alert-title" }, what), el("p", {}, explanation)];
    const fields = Array.isArray(problem.errors) ? problem.errors : [];
    // a detail that only repeats a field's message, or points at the list, is left out
    const repeated = fields.some((entry) => entry.message === problem.detail);
    const pointer = error.status === 422 && fields.length > 0;
    if (typeof problem.detail === "string" && problem.detail && !repeated && !pointer) {
      nodes.push(el("p", {}, problem.detail));
    }
    if (fields.length) {
      const items = fields.map((entry) => {
        const field = FIELD_NAMES[entry.field] || entry.field || "The request";
        return el("li", {}, `${field}: ${entry.message}`);
      });
      nodes.push(el("ul", {}, ...items));
    }
    const retry = error.response && error.response.headers.get("Retry-After");
    if (error.status === 503 && retry) nodes.push(el("p", {}, `Try again in ${retry} seconds.`));
    if (typeof problem.request_id === "string") {
      nodes.push(el("p", { class: "reference" }, `Reference for support: ${problem.request_id}`));
    }
    showAlert(nodes);
    if (error.status === 401) askForToken();
  }

  function showAlert(nodes) {
    const dismiss = el("button", { type: "button", class: "secondary" }, "Dismiss");
    dismiss.addEventListener("click", clearMessages);
    const alert = $("alert");
    alert.replaceChildren(...nodes, el("div", { class: "row actions" }, dismiss));
    alert.hidden = false;
    announce("");
  }

  // Runs an action once at a time per button; a button stays focusable while it works.
  async function busy(button, action) {
    if (button.getAttribute("aria-disabled") === "true") return;
    button.setAttribute("aria-disabled", "true");
    try {
      await action();
    } finally {
      button.removeAttribute("aria-disabled");
    }
  }

  function formatTime(iso) {
    const date = new Date(iso);
    if (Number.isNaN(date.getTime())) return iso;
    return `${date.toISOString().slice(0, 16).replace("T", " ")} UTC`;
  }

  function plural(count, one, many) {
    return `${count} ${count === 1 ? one : many}`;
  }

  // --- the document format ------------------------------------------------------------------

  function withoutFrontmatter(content) {
    const lines = content.replace(/\r\n?/g, "\n").split("\n");
    if (lines[0] === "---") {
      const end = lines.indexOf("---", 1);
      if (end > 0) return lines.slice(end + 1);
    }
    return lines;
  }

  // The text a person edits: no frontmatter (the service writes its own) and no placeholder
  // lines, so a fact can be added under any heading as it stands.
  function editableText(content) {
    const lines = withoutFrontmatter(content).filter((line) => line !== EMPTY_PLACEHOLDER);
    while (lines.length && !lines[0].trim()) lines.shift();
    return lines.join("\n");
  }

  function readSections(content) {
    const sections = [];
    let truncated = false;
    for (const line of withoutFrontmatter(content)) {
      if (line.startsWith("## ")) sections.push({ heading: line.slice(3), bullets: [] });
      else if (line.startsWith("- ") && sections.length) sections.at(-1).bullets.push(line.slice(2));
      else if (line === TRUNCATION_MARKER) truncated = true;
    }
    return { sections, truncated };
  }

  // --- the token ----------------------------------------------------------------------------

  // Whom the page shows as signed in ("user (company)"), or null when it asks for a token.
  function signedInAs() {
    return $("signed-in").hidden || !state.me ? null : `${state.me.user_id} (${state.me.company_id})`;
  }

  // A token from a link that the page did not use: said in words that never hold the token.
  function linkTokenNotUsed(reason) {
    const how = signedInAs()
      ? signIn.config
        ? "To use another account, sign out and sign in with it."
        : "To use another account, choose “Use another token” and paste it."
      : signIn.config
        ? "Sign in with your company account instead."
        : "To use it, paste it into the token field.";
    announce(`The token in the link was not used: ${reason} ${how}`);
  }

  // The page was opened with a token in its fragment (already out of the address bar). Used
  // only when the page knows that no company sign-in is configured: with sign-in, or when the
  // page could not read its configuration, the token is dropped without a request carrying it.
  function tokenFromOpeningLink(token) {
    if (!signIn.configKnown) {
      linkTokenNotUsed("the page could not read its settings. Open the link again to retry.");
    } else if (signIn.config) {
      linkTokenNotUsed("this page signs you in with your company account and takes no token from a link.");
    } else {
      useToken(token);
    }
  }

  // A token arrived in the fragment of the open page: never used. Whoever made the link could
  // otherwise swap the account under the user's eyes (or under their unsaved text). Ignoring it
  // is safer than asking "Switch to the account in the link?": the page could not say whose
  // account it is without sending the token, and a prompt is one click from the attack.
  function tokenFromChangedFragment() {
    if (!ContextMemorySignIn.tokenFromFragment()) return;
    const who = signedInAs();
    const reason = who
      ? `you are still signed in as ${who}, and an open page does not switch accounts from a link.`
      : signIn.config
        ? "this page signs you in with your company account and takes no token from a link."
        : "an open page takes a token from a link only when the page is opened with it.";
    linkTokenNotUsed(reason);
  }

  // `viaProvider`: the token came from signing in, so "Sign out" (not "Use another token")
  // ends it.
  async function useToken(token, { viaProvider = false, what = "This token could not be used." } = {}) {
    clearMessages();
    const previous = state.me;
    state.token = token;
    signIn.viaProvider = viaProvider;
    try {
      const response = await api("GET", "/v1/me");
      state.me = await response.json();
    } catch (error) {
      state.token = null;
      showProblem(error, what);
      signIn.viaProvider = false;
      return false;
    }
    // unsaved text survives a new token for the same person only, never into someone else's
    const samePerson =
      previous !== null &&
      previous.user_id === state.me.user_id &&
      previous.company_id === state.me.company_id;
    if (!samePerson) hideConflict();
    $("who").textContent = `${state.me.user_id} (${state.me.company_id})`;
    $("sign-in").hidden = true;
    $("token-form").hidden = true;
    $("signed-in").hidden = false;
    $("forget-token").hidden = viaProvider;
    $("sign-out").hidden = !viaProvider;
    await refresh({ resetText: !samePerson });
    // shown once loaded, so nothing is typed into an editor that has not got its version yet
    if (state.token) $("workspace").hidden = false;
    return Boolean(state.token);
  }

  function askForToken() {
    state.token = null;
    signIn.viaProvider = false;
    $("token").value = "";
    $("sign-in").hidden = !signIn.config;
    $("token-form").hidden = false;
    $("signed-in").hidden = true;
    $("workspace").hidden = true;
    $(signIn.config ? "sign-in-button" : "token").focus();
  }

  function forgetToken() {
    state.me = null;
    state.memory = null;
    state.settings = null;
    clearMessages();
    hideConflict();
    resetEditor();
    askForToken();
  }

  // --- signing in with the company's OpenID provider ----------------------------------------
  //
  // The flow itself (PKCE, state, nonce, the token exchange) is signin.js, shared with the admin
  // console; this page shows what it answers.

  const { SignInError } = ContextMemorySignIn;
  const signIn = ContextMemorySignIn.create({ storageKey: "memory-page.sign-in", configUrl: PAGE_CONFIG });

  function showSignInProblem(error) {
    if (!(error instanceof SignInError)) throw error;
    showAlert([el("p", { class: "alert-title" }, error.title), el("p", {}, error.detail)]);
  }

  const signInFlow = ContextMemorySignIn.flow(signIn, {
    announce,
    clearMessages,
    showProblem: (error) => showSignInProblem(error),
    useToken: (token, options) => useToken(token, options),
  });
  const startSignIn = signInFlow.start;

  async function completeSignIn(returned) {
    if (await signInFlow.complete(returned)) $("main").focus();
  }

  // Forgets the token; then, when the provider offers it, ends the session there too, which
  // sends the browser back to this page signed out.
  function signOut() {
    const url = signIn.endSessionUrl();
    forgetToken();
    if (!url) {
      announce("You are signed out.");
      return;
    }
    announce("Signing you out of your company account…");
    location.assign(url);
  }

  function offerSignIn() {
    $("token-heading").textContent = "Your account";
    $("token-label").textContent = "Or, for development, paste a token";
    $("sign-in").hidden = !$("signed-in").hidden;
  }

  // --- loading ------------------------------------------------------------------------------

  // `resetText`: the editor shows the newest version even when it holds unsaved text.
  async function refresh({ resetText = false } = {}) {
    try {
      await loadSettings();
      await loadMemory(resetText);
      await loadPolicyActions();
      await loadVersions(true);
    } catch (error) {
      showProblem(error, "Your memory could not be loaded.");
    }
  }

  async function loadSettings() {
    const response = await api("GET", "/v1/me/settings");
    state.settings = await response.json();
    renderSwitch();
  }

  async function readMemory() {
    try {
      const response = await api("GET", MEMORY);
      const memory = await response.json();
      return { ...memory, etag: etagOf(response, memory.version) };
    } catch (error) {
      if (error instanceof ApiError && error.status === 404) return null;
      throw error;
    }
  }

  async function loadMemory(resetText) {
    state.memory = await readMemory();
    renderProfile();
    const editing = $("editor").value !== state.editor.base || !$("conflict").hidden;
    if (resetText || !editing) resetEditor();
    renderEditorAvailability();
  }

  // What the company's memory policy kept out of the memory (never the values): the newest
  // page; a memory that does not exist (yet, or any more) has kept nothing out.
  async function loadPolicyActions() {
    try {
      const response = await api("GET", `${MEMORY}/policy-actions?limit=${POLICY_ACTIONS_PAGE}`);
      const page = await response.json();
      state.policyActions = { items: page.items, more: page.next_cursor !== null };
    } catch (error) {
      if (!(error instanceof ApiError && error.status === 404)) throw error;
      state.policyActions = { items: [], more: false };
    }
    renderPolicyActions();
  }

  // "2 things were not remembered: looked like a password or key; looked like an instruction
  // to the assistant." and the same for values hidden in what was remembered.
  function policySentence(items, more, one, many) {
    if (!items.length) return "";
    const reasons = [...new Set(items.map((item) => item.description).reverse())]; // oldest first
    const count = more ? `${items.length} or more` : String(items.length);
    return `${count} ${items.length === 1 && !more ? one : many}: ${reasons.join("; ")}.`;
  }

  function renderPolicyActions() {
    const { items, more } = state.policyActions;
    const dropped = items.filter((item) => item.action === "drop");
    const hidden = items.filter((item) => item.action === "redact");
    const text = [
      policySentence(dropped, more && dropped.length > 0, "thing was not remembered", "things were not remembered"),
      policySentence(hidden, more && hidden.length > 0, "value was hidden", "values were hidden"),
    ]
      .filter(Boolean)
      .join(" ");
    const note = $("not-remembered");
    note.textContent = text ? `${text} Your company's memory policy does not allow these in memory.` : "";
    note.hidden = !text;
  }

  // --- the switch ---------------------------------------------------------------------------

  function renderSwitch() {
    const on = Boolean(state.settings && state.settings.context_memory);
    $("memory-switch").setAttribute("aria-checked", String(on));
    $("switch-state").textContent = on ? "On" : "Off";
  }

  function openDialog(dialog, focusTarget, opener) {
    dialog.addEventListener("close", () => opener.focus(), { once: true });
    dialog.showModal();
    focusTarget.focus();
  }

  async function toggleSwitch() {
    const button = $("memory-switch");
    if (state.settings && state.settings.context_memory) {
      openDialog($("switch-dialog"), $("switch-cancel"), button);
      return;
    }
    await busy(button, async () => {
      clearMessages();
      try {
        await api("PATCH", "/v1/me/settings", { body: { context_memory: true } });
      } catch (error) {
        showProblem(error, "Context memory was not turned on.");
        return;
      }
      await refresh();
      announce("Context memory is on. The assistant will learn about you again from your next conversations.");
    });
  }

  async function confirmSwitchOff() {
    await busy($("switch-confirm"), async () => {
      clearMessages();
      let update;
      try {
        const response = await api("PATCH", "/v1/me/settings", { body: { context_memory: false } });
        update = await response.json();
      } catch (error) {
        $("switch-dialog").close();
        showProblem(error, "Context memory was not turned off.");
        return;
      }
      $("switch-dialog").close();
      hideConflict();
      await refresh({ resetText: true });
      announce(`Context memory is off. ${deletionSummary(update.deleted)}`);
    });
  }

  function deletionSummary(deleted) {
    if (!deleted || (!deleted.profile && !deleted.versions && !deleted.jobs)) {
      return "There was no memory to delete.";
    }
    const parts = [plural(deleted.versions, "version", "versions")];
    if (deleted.jobs) parts.push(plural(deleted.jobs, "pending update", "pending updates"));
    return `Your memory was permanently deleted (${parts.join(", ")}).`;
  }

  function cancelSwitchOff() {
    $("switch-dialog").close();
    announce("Context memory stays on; nothing was deleted.");
  }

  // --- the profile --------------------------------------------------------------------------

  function renderProfile() {
    const box = $("profile");
    const meta = $("profile-meta");
    const memory = state.memory;
    if (!memory) {
      const off = state.settings && state.settings.context_memory === false;
      meta.textContent = "";
      box.replaceChildren(
        el(
          "p",
          { class: "no-profile" },
          off
            ? "Context memory is off, so nothing is remembered about you."
            : "Nothing yet: the assistant has not remembered anything about you. It learns " +
                "from your conversations, or you can write it yourself under Edit.",
        ),
      );
      $("delete-memory").hidden = true;
      return;
    }
    meta.textContent =
      `Version ${memory.version} · updated ${formatTime(memory.updated_at)} · ` +
      plural(memory.tokens, "token", "tokens");
    const { sections, truncated } = readSections(memory.content);
    const nodes = sections.map((section) => {
      const body = section.bullets.length
        ? el("ul", {}, ...section.bullets.map((bullet) => el("li", {}, bullet)))
        : el("p", { class: "empty" }, "Nothing here yet.");
      return el("section", { class: "profile-section" }, el("h3", {}, section.heading), body);
    });
    if (truncated) {
      nodes.push(el("p", { class: "truncated" }, "Older facts were left out to fit the memory budget."));
    }
    box.replaceChildren(...nodes);
    $("delete-memory").hidden = false;
  }

  // --- editing and conflicts ----------------------------------------------------------------

  function resetEditor() {
    const text = state.memory ? editableText(state.memory.content) : NEW_PROFILE;
    $("editor").value = text;
    state.editor = { etag: state.memory ? state.memory.etag : null, base: text };
  }

  function renderEditorAvailability() {
    const off = Boolean(state.settings && state.settings.context_memory === false);
    $("editor").disabled = off;
    $("editor").hidden = off;
    $("editor-label").hidden = off;
    $("save").hidden = off;
    $("revert").hidden = off;
    $("editor-help").textContent = off
      ? "Turn context memory on to write your memory."
      : "Six sections, each a heading starting with ##; one fact per line starting with - .";
  }

  async function save() {
    await busy($("save"), async () => {
      clearMessages();
      const text = $("editor").value;
      const etag = state.newerEtag || state.editor.etag;
      const headers = etag ? { "If-Match": etag } : { "If-None-Match": "*" };
      const before = state.memory && state.memory.version;
      let response;
      try {
        response = await api("PUT", MEMORY, { body: { content: text }, headers });
      } catch (error) {
        if (error instanceof ApiError && error.status === 412) await showConflict();
        else if (error instanceof ApiError && error.status === 401) {
          showProblem(error, "Your text was not saved yet: it is kept here until you paste a new token.");
        } else showProblem(error, "Your text was not saved.");
        return;
      }
      const saved = await response.json();
      state.memory = { ...saved, etag: etagOf(response, saved.version) };
      hideConflict();
      resetEditor();
      renderProfile();
      await loadPolicyActions().catch((error) => showProblem(error, "Your memory could not be loaded."));
      await loadVersions(true);
      if (response.status === 201) announce(`Your memory was created as version ${saved.version}.`);
      else if (saved.version === before) announce(`Nothing to save: your text holds the same facts as version ${saved.version}.`);
      else announce(`Saved as version ${saved.version}.`);
    });
  }

  async function showConflict() {
    let newer;
    try {
      newer = await readMemory();
    } catch (error) {
      showProblem(error, "Your text was not saved, and the newer version could not be read.");
      return;
    }
    state.memory = newer;
    renderProfile();
    await loadVersions(true).catch((error) => showProblem(error, "The history could not be loaded."));
    const message = $("conflict-message");
    if (newer) {
      state.newerEtag = newer.etag;
      $("newer-heading").textContent = `The newer version (${newer.version})`;
      $("newer-text").textContent = editableText(newer.content);
      $("newer-panel").hidden = false;
      $("edit-grid").classList.add("side-by-side");
      $("editor-label").textContent = "Your text (not saved yet)";
      message.textContent =
        `Not saved: your memory changed while you were editing, and version ${newer.version} ` +
        "is newer than the one you started from. Your text is kept. Compare the two, then " +
        "choose which to keep.";
    } else {
      state.newerEtag = null;
      state.editor.etag = null;
      message.textContent =
        "Not saved: your memory was deleted while you were editing. Your text is kept; " +
        "saving it creates your memory again.";
    }
    $("use-mine").textContent = newer
      ? "Use my text on top of the newer version"
      : "Save my text as a new memory";
    $("conflict").hidden = false; // role="alert": read out as it appears
    $("use-mine").focus();
  }

  function hideConflict() {
    state.newerEtag = null;
    $("conflict").hidden = true;
    $("newer-panel").hidden = true;
    $("edit-grid").classList.remove("side-by-side");
    $("editor-label").textContent = "Your text";
  }

  function takeNewer() {
    hideConflict();
    resetEditor();
    $("editor").focus();
    announce("Your text was discarded; the editor shows the newest version.");
  }

  function revert() {
    hideConflict();
    resetEditor();
    announce("Your changes were undone.");
  }

  // --- history ------------------------------------------------------------------------------

  async function loadVersions(reset) {
    if (reset) {
      state.cursor = null;
      $("versions").replaceChildren();
    }
    const query = new URLSearchParams({ limit: String(VERSIONS_PAGE) });
    if (state.cursor) query.set("cursor", state.cursor);
    let page;
    try {
      page = await (await api("GET", `${MEMORY}/versions?${query}`)).json();
    } catch (error) {
      if (!(error instanceof ApiError && error.status === 404)) throw error;
      page = { items: [], next_cursor: null };
    }
    const items = page.items.map(renderVersion);
    $("versions").append(...items.map((item) => item.node));
    state.cursor = page.next_cursor;
    $("older").hidden = !page.next_cursor;
    $("history-empty").hidden = $("versions").children.length > 0;
    await Promise.all(items.map((item) => item.loadDiff()));
  }

  function renderVersion(version) {
    const current = state.memory && state.memory.version === version.version;
    const heading = el("h3", {}, `Version ${version.version}`);
    if (current) heading.append(el("span", { class: "current-badge" }, "current"));
    const counts = version.operation_counts || {};
    const changes = [
      counts.ADD ? `${counts.ADD} added` : "",
      counts.UPDATE ? `${counts.UPDATE} changed` : "",
      counts.DELETE ? `${counts.DELETE} removed` : "",
    ].filter(Boolean);
    const meta = [REASONS[version.reason] || version.reason, formatTime(version.created_at)];
    if (changes.length) meta.push(changes.join(", "));
    const diffBox = el("div", { class: "diff-box" }, el("p", { class: "meta" }, "Loading the changes…"));
    const node = el("li", { class: "version", "data-version": String(version.version) }, heading, el("p", { class: "meta" }, meta.join(" · ")), diffBox);
    if (!current && state.memory) {
      const restore = el("button", { type: "button", class: "secondary" }, `Restore version ${version.version}`);
      restore.addEventListener("click", () => busy(restore, () => restoreVersion(version.version)));
      node.append(el("div", { class: "row actions" }, restore));
    }
    const loadDiff = async () => {
      try {
        const diff = await (await api("GET", `${MEMORY}/versions/${version.version}/diff`)).json();
        diffBox.replaceChildren(...renderDiff(diff));
      } catch (error) {
        if (!(error instanceof ApiError)) throw error;
        const words = (error.problem && error.problem.detail) || STATUS_WORDS[error.status] || `HTTP ${error.status}`;
        diffBox.replaceChildren(el("p", { class: "meta" }, `The changes could not be loaded: ${words}`));
      }
    };
    return { node, loadDiff };
  }

  // A unified diff as lines marked added (+) or removed (−). Left out: the file headers and the
  // frontmatter, which the service writes as every document's first lines (six and a blank)
  // and which a person did not write: its changes are bookkeeping (last updated, turn count).
  function renderDiff(diff) {
    const caption = el(
      "p",
      { class: "diff-caption" },
      diff.from === 0 ? "Changes from an empty memory:" : `Changes from version ${diff.from}:`,
    );
    const lines = diff.diff.split("\n");
    if (lines.at(-1) === "") lines.pop();
    const rows = [];
    let oldLine = 0;
    let newLine = 0;
    let gap = false; // lines were skipped since the last row shown
    lines.forEach((line, index) => {
      if (index < 2 && (line.startsWith("--- ") || line.startsWith("+++ "))) return;
      const hunk = HUNK_HEADER.exec(line);
      if (hunk) {
        [oldLine, newLine] = [Number(hunk[1]), Number(hunk[2])];
        gap = rows.length > 0;
        return;
      }
      if (line.startsWith("\\")) return; // "\ No newline at end of file"
      const kind = line[0] === "+" ? "added" : line[0] === "-" ? "removed" : "context";
      const number = kind === "removed" ? oldLine : newLine;
      if (kind !== "added") oldLine += 1;
      if (kind !== "removed") newLine += 1;
      if (number <= FRONTMATTER_LINES) {
        gap = gap || rows.length > 0;
        return;
      }
      if (gap) rows.push(diffRow("hunk", "⋯", "Unchanged lines left out", ""));
      gap = false;
      const marker = kind === "added" ? "+" : kind === "removed" ? "−" : " ";
      const spoken = kind === "added" ? "Added: " : kind === "removed" ? "Removed: " : "";
      rows.push(diffRow(kind, marker, spoken, line.slice(1)));
    });
    if (!rows.some((row) => !row.classList.contains("context"))) {
      const words = diff.diff
        ? "No change to the facts: only the date of the last update or the turn count."
        : "No changes.";
      return [caption, el("p", { class: "no-changes" }, words)];
    }
    const label = `Changes in version ${diff.to}`;
    return [caption, el("div", { class: "diff", role: "group", "aria-label": label }, ...rows)];
  }

  function diffRow(kind, marker, spoken, text) {
    return el(
      "div",
      { class: `diff-line ${kind}` },
      el("span", { class: "diff-marker", "aria-hidden": "true" }, marker),
      el("span", { class: "sr-only" }, spoken),
      el("span", { class: "diff-text" }, text || " "),
    );
  }

  async function restoreVersion(number) {
    clearMessages();
    if (!state.memory) return;
    let response;
    try {
      response = await api("POST", `${MEMORY}/versions/${number}/restore`, {
        headers: { "If-Match": state.memory.etag },
      });
    } catch (error) {
      if (error instanceof ApiError && error.status === 412) {
        await refresh();
        announce("Your memory changed in the meantime; the page now shows the newest version. Restore again if you still want to.");
      } else {
        showProblem(error, `Version ${number} was not restored.`);
      }
      return;
    }
    const restored = await response.json();
    await refresh();
    $("history-heading").focus();
    announce(
      response.status === 201
        ? `Version ${number} was restored as version ${restored.version}.`
        : `Version ${number} already holds the same facts as your current memory; nothing changed.`,
    );
  }

  // --- export and delete --------------------------------------------------------------------

  async function exportEverything() {
    clearMessages();
    let text;
    try {
      text = await (await api("GET", `${MEMORY}/export`)).text();
    } catch (error) {
      showProblem(error, "The export failed.");
      return;
    }
    const url = URL.createObjectURL(new Blob([text], { type: "application/json" }));
    const user = String(state.me.user_id).replace(/[^A-Za-z0-9._-]+/g, "_");
    const day = new Date().toISOString().slice(0, 10);
    const link = el("a", { href: url, download: `memory-export-${user}-${day}.json`, hidden: "" });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60_000);
    announce("Your export was downloaded as a JSON file.");
  }

  async function confirmDelete() {
    await busy($("delete-confirm"), async () => {
      clearMessages();
      const headers = state.memory ? { "If-Match": state.memory.etag } : {};
      try {
        await api("DELETE", MEMORY, { headers });
      } catch (error) {
        $("delete-dialog").close();
        if (error instanceof ApiError && (error.status === 412 || error.status === 404)) {
          await refresh();
          announce(
            error.status === 404
              ? "There was no memory to delete."
              : "Your memory changed in the meantime, so nothing was deleted. The page now shows the newest version.",
          );
        } else {
          showProblem(error, "Your memory was not deleted.");
        }
        return;
      }
      $("delete-dialog").close();
      hideConflict();
      await refresh({ resetText: true });
      announce("Your memory was permanently deleted. Context memory is still on.");
    });
  }

  // --- wiring -------------------------------------------------------------------------------

  async function start() {
    $("token-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const token = $("token").value.trim();
      $("token").value = "";
      if (!token) {
        $("token").focus();
        return;
      }
      useToken(token).then((ok) => ok && $("main").focus());
    });
    $("forget-token").addEventListener("click", forgetToken);
    $("sign-in-button").addEventListener("click", (event) => busy(event.currentTarget, startSignIn));
    $("sign-out").addEventListener("click", signOut);
    $("memory-switch").addEventListener("click", () => toggleSwitch());
    $("switch-cancel").addEventListener("click", cancelSwitchOff);
    $("switch-confirm").addEventListener("click", () => confirmSwitchOff());
    $("switch-dialog").addEventListener("cancel", () => announce("Context memory stays on; nothing was deleted."));
    $("export").addEventListener("click", (event) => busy(event.currentTarget, exportEverything));
    $("delete-memory").addEventListener("click", (event) => {
      openDialog($("delete-dialog"), $("delete-cancel"), event.currentTarget);
    });
    $("delete-cancel").addEventListener("click", () => $("delete-dialog").close());
    $("delete-confirm").addEventListener("click", () => confirmDelete());
    $("save").addEventListener("click", () => save());
    $("use-mine").addEventListener("click", () => save());
    $("take-newer").addEventListener("click", takeNewer);
    $("revert").addEventListener("click", revert);
    $("older").addEventListener("click", (event) =>
      busy(event.currentTarget, () =>
        loadVersions(false).catch((error) => showProblem(error, "Older versions could not be loaded.")),
      ),
    );
    $("history-heading").setAttribute("tabindex", "-1");
    window.addEventListener("hashchange", tokenFromChangedFragment);
    resetEditor();
    const returned = signIn.takeAnswer();
    const linked = ContextMemorySignIn.tokenFromFragment(); // out of the address bar now, used or not
    if (await signIn.loadConfig()) offerSignIn();
    if (linked) tokenFromOpeningLink(linked);
    if (returned) await completeSignIn(returned);
  }

  start();
})();
