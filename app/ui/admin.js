// The admin console: a company's spaces and settings through the public /v1 admin routes.
//
// Who sees what follows the token's roles, as GET /v1/me names them, and what the service
// answers: a space admin gets their company's spaces; a company operator (`company_operator`)
// gets their own company's pages (flags, spaces, memory policy, rate limits, model budget,
// usage, jobs, audit log, erasure requests); an operator the company list answers (a platform
// operator) gets the list of companies, any company's pages and offboarding. The service
// decides every permission again: the console only leaves out what the caller could not use.
//
// The token is handled as on the memory page (signin.js, shared by both): it lives in
// `state.token` only; with company sign-in configured it comes from the OpenID provider (code
// flow with PKCE); a token in the fragment of the opening link is used only without sign-in,
// and a changed fragment never signs anyone in. Routes that a deployment does not have yet
// (the service's own API description says which it has) are left out of the console, saying so.
// Everything the service returns is put on the page as text nodes, never parsed as HTML.
"use strict";

(() => {
  const API_ROOT = new URL("../", location.href);
  const PAGE_CONFIG = new URL("config.json", location.href);
  const SVG = "http://www.w3.org/2000/svg";
  const PAGE_SIZE = 20;
  const MIN_TOKENS = 500;
  const MAX_TOKENS = 8000;
  const ROUTES = {
    companies: "/v1/companies",
    company: "/v1/companies/{company_id}",
    companySpaces: "/v1/companies/{company_id}/spaces",
    spaceSettings: "/v1/companies/{company_id}/spaces/{space_id}/settings",
    eraseUser: "/v1/companies/{company_id}/users/{user_id}",
  };
  const NEEDS_COMPANY_ROUTES = "This service does not offer this yet: it needs the company routes.";
  const PAGES = [
    { id: "companies", label: "Companies", who: "platform" },
    { id: "spaces", label: "Spaces", who: "any" },
    { id: "flags", label: "Feature flags", who: "company" },
    { id: "policy", label: "Memory policy", who: "company" },
    { id: "limits", label: "Rate limits", who: "company" },
    { id: "budget", label: "Model budget", who: "company" },
    { id: "usage", label: "Usage", who: "company" },
    { id: "jobs", label: "Jobs", who: "company" },
    { id: "audit", label: "Audit log", who: "company" },
    { id: "erasure", label: "Erasure requests", who: "company" },
  ];
  const POLICY_CATEGORIES = {
    secrets: "Secrets (passwords, keys, tokens)",
    payment_cards: "Payment cards",
    bank_accounts: "Bank accounts",
    national_ids: "National ids",
    email_addresses: "E-mail addresses",
    phone_numbers: "Phone numbers",
    instructions: "Instructions to the assistant",
  };
  const POLICY_ACTIONS = ["drop", "redact", "allow"];
  const LIMIT_CLASSES = {
    context: "Context (load and inject)",
    turns: "Turns (turn-save)",
    consolidations: "Explicit consolidations",
    exports: "Exports",
    memory_writes: "Memory writes",
  };
  const LIMIT_SCOPES = { user: "Per user", company: "Whole company" };
  const STATUS_WORDS = {
    0: "The service could not be reached. Check your connection and try again.",
    401: "Your token was not accepted: it may have expired or be mistyped. Paste a new token.",
    403: "Your role does not allow this.",
    404: "It was not found, or it is not yours to see.",
    409: "It conflicts with the current state.",
    422: "Some of what was sent is not valid.",
    429: "Too many requests: wait a moment and try again.",
    503: "The service is briefly unavailable: try again in a moment.",
  };
  const SIGNED_IN_401 = "Your sign-in has expired or was not accepted. Sign in again.";

  const state = {
    token: null,
    me: null,
    routes: new Set(), // the paths of the service's API description
    platform: false, // the company list answered: a platform operator
    company: null, // the company the pages show
    page: null,
    space: null, // the open space's settings, as the service answered them
    cursors: { jobs: null, audit: null, companies: null },
  };

  const $ = (id) => document.getElementById(id);
  const { SignInError } = ContextMemorySignIn;
  const signIn = ContextMemorySignIn.create({ storageKey: "admin-console.sign-in", configUrl: PAGE_CONFIG });

  // --- the API ----------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, problem, response) {
      super((problem && problem.title) || `HTTP ${status}`);
      this.status = status;
      this.problem = problem;
      this.response = response;
    }
  }

  function path(template, values) {
    return template.replace(/\{(\w+)\}/g, (_, name) => encodeURIComponent(values[name]));
  }

  function companyPath(suffix) {
    return `/v1/companies/${encodeURIComponent(state.company)}${suffix}`;
  }

  async function api(method, route, { body } = {}) {
    if (!state.token) throw new ApiError(401, null, null);
    const init = {
      method,
      headers: { Authorization: `Bearer ${state.token}`, Accept: "application/json" },
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
      response = await fetch(new URL(route.slice(1), API_ROOT), init);
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

  async function json(method, route, options) {
    const response = await api(method, route, options);
    return response.status === 204 ? null : response.json();
  }

  function hasRoute(template) {
    return state.routes.has(template);
  }

  // The paths the service describes, so the console offers only what this deployment has.
  async function loadRoutes() {
    try {
      const response = await fetch(new URL("openapi.json", API_ROOT), { cache: "no-store", credentials: "omit" });
      const spec = response.ok ? await response.json() : null;
      state.routes = new Set(Object.keys((spec && spec.paths) || {}));
    } catch {
      state.routes = new Set();
    }
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

  function svg(tag, attributes = {}, ...children) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, String(value));
    node.append(...children);
    return node;
  }

  function announce(message) {
    $("status").textContent = message;
  }

  function clearMessages() {
    $("alert").replaceChildren();
    $("alert").hidden = true;
    announce("");
  }

  function showAlert(nodes) {
    const dismiss = el("button", { type: "button", class: "secondary" }, "Dismiss");
    dismiss.addEventListener("click", clearMessages);
    $("alert").replaceChildren(...nodes, el("div", { class: "row actions" }, dismiss));
    $("alert").hidden = false;
    announce("");
  }

  function showProblem(error, what) {
    if (!(error instanceof ApiError)) throw error;
    const problem = error.problem && typeof error.problem === "object" ? error.problem : {};
    const words = error.status === 401 && signIn.viaProvider ? SIGNED_IN_401 : STATUS_WORDS[error.status];
    const nodes = [el("p", { class: "alert-title" }, what), el("p", {}, words || problem.title || `The service answered ${error.status}.`)];
    if (typeof problem.detail === "string" && problem.detail) nodes.push(el("p", {}, problem.detail));
    const fields = Array.isArray(problem.errors) ? problem.errors : [];
    if (fields.length) nodes.push(el("ul", {}, ...fields.map((entry) => el("li", {}, `${entry.field || "The request"}: ${entry.message}`))));
    if (typeof problem.request_id === "string") {
      nodes.push(el("p", { class: "reference" }, `Reference for support: ${problem.request_id}`));
    }
    showAlert(nodes);
    if (error.status === 401) askForToken();
  }

  function showSignInProblem(error) {
    if (!(error instanceof SignInError)) throw error;
    showAlert([el("p", { class: "alert-title" }, error.title), el("p", {}, error.detail)]);
  }

  // Runs an action once at a time per control; the control stays focusable while it works.
  async function busy(button, action) {
    if (button.getAttribute("aria-busy") === "true") return;
    button.setAttribute("aria-busy", "true");
    try {
      await action();
    } finally {
      button.removeAttribute("aria-busy");
    }
  }

  function formatTime(iso) {
    const date = new Date(iso);
    if (!iso || Number.isNaN(date.getTime())) return iso || "";
    return `${date.toISOString().slice(0, 16).replace("T", " ")} UTC`;
  }

  function formatNumber(value) {
    return typeof value === "number" ? value.toLocaleString("en") : String(value);
  }

  // A flat "key: value" list of an answer's scalar fields (nested ones with dotted keys).
  function flatten(value, prefix = "") {
    if (value === null || typeof value !== "object") return [[prefix, value]];
    return Object.entries(value).flatMap(([key, inner]) => flatten(inner, prefix ? `${prefix}.${key}` : key));
  }

  function describeChange(value) {
    return value === null || value === undefined ? "—" : JSON.stringify(value);
  }

  // A confirmation that needs `expected` typed in; resolves to whether it was confirmed.
  function confirmTyped({ title, text, label, expected, ok }) {
    const dialog = $("confirm-dialog");
    $("confirm-title").textContent = title;
    $("confirm-text").textContent = text;
    $("confirm-label").textContent = label;
    $("confirm-ok").textContent = ok;
    const input = $("confirm-input");
    input.value = "";
    $("confirm-ok").disabled = true;
    return new Promise((resolve) => {
      const onInput = () => {
        $("confirm-ok").disabled = input.value !== expected;
      };
      const finish = (answer) => {
        input.removeEventListener("input", onInput);
        $("confirm-form").onsubmit = null;
        $("confirm-cancel").onclick = null;
        dialog.onclose = null;
        if (dialog.open) dialog.close();
        resolve(answer);
      };
      input.addEventListener("input", onInput);
      $("confirm-form").onsubmit = (event) => {
        event.preventDefault();
        if (input.value === expected) finish(true);
      };
      $("confirm-cancel").onclick = () => finish(false);
      dialog.onclose = () => finish(false);
      dialog.showModal();
      input.focus();
    });
  }

  // --- the token ----------------------------------------------------------------------------

  async function useToken(token, { viaProvider = false, what = "This token could not be used." } = {}) {
    clearMessages();
    state.token = token;
    signIn.viaProvider = viaProvider;
    try {
      state.me = await json("GET", "/v1/me");
    } catch (error) {
      state.token = null;
      signIn.viaProvider = false;
      showProblem(error, what);
      return false;
    }
    $("who").textContent = `${state.me.user_id} (${state.me.company_id})`;
    $("sign-in").hidden = true;
    $("token-form").hidden = true;
    $("signed-in").hidden = false;
    $("forget-token").hidden = viaProvider;
    $("sign-out").hidden = !viaProvider;
    await openConsole();
    return true;
  }

  function askForToken() {
    state.token = null;
    signIn.viaProvider = false;
    $("token").value = "";
    $("sign-in").hidden = !signIn.config;
    $("token-form").hidden = false;
    $("signed-in").hidden = true;
    $("console").hidden = true;
    $(signIn.config ? "sign-in-button" : "token").focus();
  }

  function forgetToken() {
    state.me = null;
    state.space = null;
    clearMessages();
    askForToken();
  }

  // The page was opened with a token in its fragment (already out of the address bar): used
  // only when the page knows that no company sign-in is configured.
  function tokenFromOpeningLink(token) {
    if (!signIn.configKnown) {
      announce("The token in the link was not used: the page could not read its settings. Open the link again to retry.");
    } else if (signIn.config) {
      announce("The token in the link was not used: this page signs you in with your company account and takes no token from a link.");
    } else {
      useToken(token);
    }
  }

  // A token that arrives in the fragment of the open page is never used (see memory.js).
  function tokenFromChangedFragment() {
    if (!ContextMemorySignIn.tokenFromFragment()) return;
    announce("The token in the link was not used: an open page does not switch accounts from a link.");
  }

  const signInFlow = ContextMemorySignIn.flow(signIn, {
    announce,
    clearMessages,
    showProblem: (error) => showSignInProblem(error),
    useToken: (token, options) => useToken(token, options), // focuses the first page's heading
  });
  const startSignIn = signInFlow.start;
  const completeSignIn = signInFlow.complete;

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

  // --- roles and pages ----------------------------------------------------------------------

  function roles() {
    return new Set(Array.isArray(state.me && state.me.roles) ? state.me.roles : []);
  }

  function isOperator() {
    return roles().has("operator");
  }

  function isCompanyOperator() {
    return roles().has("company_operator");
  }

  function isSpaceAdmin() {
    return roles().has("space_admin");
  }

  function allowed(page) {
    if (page.who === "platform") return state.platform;
    if (page.who === "company") return isOperator() || isCompanyOperator();
    return isOperator() || isCompanyOperator() || isSpaceAdmin();
  }

  // the page a company opens on: the first the caller may use, spaces as the last resort
  function firstPage(wanted) {
    const page = PAGES.find((p) => p.id === wanted);
    return page && allowed(page) ? wanted : "spaces";
  }

  async function openConsole() {
    await loadRoutes();
    state.platform = false;
    if (isOperator() && hasRoute(ROUTES.companies)) {
      try {
        await api("GET", `${ROUTES.companies}?limit=1`);
        state.platform = true;
      } catch (error) {
        if (!(error instanceof ApiError) || ![403, 404].includes(error.status)) throw error;
      }
    }
    const names = [
      state.platform ? "platform operator" : isOperator() ? "operator" : "",
      isCompanyOperator() && !isOperator() ? "company operator" : "",
      isSpaceAdmin() ? "space admin" : "",
    ].filter(Boolean);
    $("roles").textContent = names.length ? `· ${names.join(", ")}` : "";
    $("console").hidden = false;
    const any = PAGES.some(allowed);
    $("no-role").hidden = any;
    $("nav").hidden = !any;
    if (!any) {
      $("company-bar").hidden = true;
      return;
    }
    if (state.platform) await showPage("companies");
    else await openCompany(state.me.company_id, "flags");
  }

  function renderNav() {
    const items = PAGES.filter(allowed)
      .filter((page) => page.id === "companies" || state.company !== null)
      .map((page) => {
        const button = el("button", { type: "button", class: "secondary", "data-page": page.id }, page.label);
        if (page.id === state.page) button.setAttribute("aria-current", "page");
        button.addEventListener("click", () => showPage(page.id));
        return el("li", {}, button);
      });
    $("nav-list").replaceChildren(...items);
  }

  async function openCompany(companyId, page = "flags") {
    state.company = companyId;
    state.space = null;
    $("space").hidden = true;
    $("company-name").textContent = companyId;
    $("company-bar").hidden = false;
    $("back-to-companies").hidden = !state.platform;
    await showPage(firstPage(page));
  }

  const LOADERS = {
    companies: () => loadCompanies(true),
    spaces: loadSpaces,
    flags: loadFlags,
    policy: loadPolicy,
    limits: loadLimits,
    budget: loadBudget,
    usage: loadUsage,
    jobs: () => loadJobs(true),
    audit: () => loadAudit(true),
    erasure: loadErasures,
  };

  async function showPage(id) {
    clearMessages();
    state.page = id;
    for (const page of PAGES) $(`page-${page.id}`).hidden = page.id !== id;
    if (id === "companies") $("company-bar").hidden = true;
    else if (state.company !== null) $("company-bar").hidden = false;
    renderNav();
    try {
      await LOADERS[id]();
    } catch (error) {
      showProblem(error, "This page could not be loaded.");
    }
    $(`${id}-heading`).focus();
  }

  // --- companies (platform operators) -------------------------------------------------------

  async function loadCompanies(reset) {
    if (reset) {
      state.cursors.companies = null;
      $("companies").replaceChildren();
    }
    const query = new URLSearchParams({ limit: String(PAGE_SIZE) });
    if (state.cursors.companies) query.set("cursor", state.cursors.companies);
    const page = await json("GET", `${ROUTES.companies}?${query}`);
    $("companies").append(...page.items.map(companyRow));
    state.cursors.companies = page.next_cursor;
    $("companies-more").hidden = !page.next_cursor;
    $("companies-table").hidden = $("companies").children.length === 0;
    $("companies-absent").hidden = $("companies").children.length > 0;
    $("companies-absent").textContent = "No companies yet.";
  }

  function companyRow(company) {
    const id = company.company_id || company.id;
    const summary = flatten(company)
      .filter(([key]) => key !== "company_id" && key !== "id")
      .map(([key, value]) => `${key}: ${value === null ? "—" : formatNumber(value)}`)
      .join(" · ");
    const open = el("button", { type: "button", class: "secondary" }, `Open ${id}`);
    open.addEventListener("click", () => openCompany(id));
    const actions = el("div", { class: "row" }, open);
    if (hasRoute(ROUTES.company)) {
      const offboard = el("button", { type: "button", class: "danger" }, `Offboard ${id}…`);
      offboard.addEventListener("click", () => busy(offboard, () => offboardCompany(id)));
      actions.append(offboard);
    }
    return el("tr", { "data-company": id }, el("th", { scope: "row" }, id), el("td", {}, summary), el("td", {}, actions));
  }

  async function offboardCompany(id) {
    clearMessages();
    const confirmed = await confirmTyped({
      title: `Offboard ${id}?`,
      text: `This erases everything the service holds for ${id}: its settings, spaces, every user's memory and chats. It cannot be undone.`,
      label: `Type the company id (${id}) to confirm`,
      expected: id,
      ok: "Offboard and erase",
    });
    if (!confirmed) {
      announce(`${id} was not offboarded.`);
      return;
    }
    let receipt;
    try {
      receipt = await json("DELETE", path(ROUTES.company, { company_id: id }));
    } catch (error) {
      showProblem(error, `${id} was not offboarded.`);
      return;
    }
    const rows = flatten(receipt || {}).flatMap(([key, value]) => [el("dt", {}, key), el("dd", {}, value === null ? "—" : String(value))]);
    $("offboard-receipt-heading").textContent = `Offboarding receipt for ${id}`;
    $("offboard-receipt-list").replaceChildren(...rows);
    $("offboard-receipt").hidden = false;
    await loadCompanies(true).catch((error) => showProblem(error, "The companies could not be loaded."));
    announce(`${id} is being offboarded; its receipt is below.`);
    $("offboard-receipt-heading").focus();
  }

  // --- spaces -------------------------------------------------------------------------------

  function spaceAdminHere() {
    return isSpaceAdmin() && state.me && state.company === state.me.company_id;
  }

  function spaceRoute(spaceId) {
    if (spaceAdminHere()) return `/v1/spaces/${encodeURIComponent(spaceId)}`;
    if (hasRoute(ROUTES.spaceSettings)) return path(ROUTES.spaceSettings, { company_id: state.company, space_id: spaceId });
    return null;
  }

  async function loadSpaces() {
    const list = $("space-list");
    list.hidden = true;
    if (!hasRoute(ROUTES.companySpaces)) return;
    let page;
    try {
      page = await json("GET", `${companyPath("/spaces")}?limit=100`);
    } catch (error) {
      if (error instanceof ApiError && [403, 404].includes(error.status)) return;
      throw error;
    }
    const items = page.items.map((space) => {
      const id = space.space_id || space.id;
      const button = el("button", { type: "button", class: "secondary" }, id);
      button.addEventListener("click", () => openSpace(id));
      return el("li", {}, button);
    });
    list.replaceChildren(...items);
    list.hidden = items.length === 0;
  }

  async function openSpace(spaceId) {
    clearMessages();
    const route = spaceRoute(spaceId);
    if (!route) {
      showAlert([el("p", { class: "alert-title" }, `Space ${spaceId} could not be opened.`), el("p", {}, NEEDS_COMPANY_ROUTES)]);
      return;
    }
    try {
      state.space = await json("GET", route);
    } catch (error) {
      showProblem(error, `Space ${spaceId} could not be opened.`);
      return;
    }
    renderSpace();
    $("space").hidden = false;
    $("space-heading").focus();
  }

  async function changeSpace(change, what) {
    const route = spaceRoute(state.space.space_id);
    const method = spaceAdminHere() ? "PATCH" : "PUT";
    try {
      state.space = await json(method, route, { body: change });
    } catch (error) {
      showProblem(error, what);
      return false;
    }
    renderSpace();
    return true;
  }

  function setSwitch(button, on) {
    button.setAttribute("aria-checked", on ? "true" : "false");
  }

  function renderSpace() {
    const space = state.space;
    $("space-heading").textContent = `Space ${space.space_id}`;
    $("space-meta").textContent = space.updated_at
      ? `Last changed ${formatTime(space.updated_at)} by ${space.updated_by} (${space.updated_by_company_id}).`
      : "Never changed: every setting is at its default.";
    const control = space.switch || { visible: true, editable: true, tooltip: null };
    const memory = $("context-memory-switch");
    $("context-memory-row").hidden = !control.visible;
    $("context-memory-hidden").hidden = control.visible;
    setSwitch(memory, space.context_memory_effective);
    const tooltip = $("context-memory-tooltip");
    if (control.editable) {
      memory.removeAttribute("aria-disabled");
      memory.removeAttribute("title");
      memory.setAttribute("aria-describedby", "context-memory-help");
      tooltip.textContent = "";
    } else {
      memory.setAttribute("aria-disabled", "true");
      memory.setAttribute("title", control.tooltip || "");
      memory.setAttribute("aria-describedby", "context-memory-tooltip context-memory-help");
      tooltip.textContent = control.tooltip || "";
    }
    tooltip.hidden = true;
    $("context-memory-state").textContent = control.editable ? (space.context_memory_effective ? "On" : "Off") : "Unavailable";
    $("context-memory-help").textContent = control.editable
      ? "When it is on, the assistant remembers what it learns about each user of this space across conversations."
      : "";
    setSwitch($("web-search-switch"), space.web_search);
    $("web-search-state").textContent = space.web_search ? "On" : "Off";
    const config = space.user_memory;
    $("use-orchestrator").checked = config.use_orchestrator_language_model;
    $("language-model").value = config.language_model;
    $("max-tokens").value = String(config.max_tokens);
    $("max-tokens").removeAttribute("aria-invalid");
    renderDecision(space.decision);
  }

  function renderDecision(decision) {
    if (!decision) {
      $("space-decision").replaceChildren();
      return;
    }
    const rows = [el("dt", {}, "Context memory in this space"), el("dd", {}, `${decision.enabled ? "Active" : "Not active"}: ${decision.reason}`)];
    for (const condition of decision.conditions || []) {
      rows.push(el("dt", {}, `${condition.satisfied ? "✓" : "✗"} ${condition.key}`), el("dd", {}, condition.reason));
    }
    $("space-decision").replaceChildren(...rows);
  }

  function showTooltip(shown) {
    const tooltip = $("context-memory-tooltip");
    tooltip.hidden = !shown || !tooltip.textContent;
  }

  async function toggleContextMemory() {
    const button = $("context-memory-switch");
    if (button.getAttribute("aria-disabled") === "true") {
      showTooltip(true);
      announce($("context-memory-tooltip").textContent);
      return;
    }
    await busy(button, async () => {
      clearMessages();
      const on = !state.space.context_memory_effective;
      if (await changeSpace({ context_memory: on }, "Context memory was not changed.")) {
        announce(`Context memory is ${on ? "on" : "off"} for space ${state.space.space_id}.`);
      }
    });
  }

  async function toggleWebSearch() {
    await busy($("web-search-switch"), async () => {
      clearMessages();
      const on = !state.space.web_search;
      if (await changeSpace({ web_search: on }, "Web search was not changed.")) {
        const blocked = state.space.switch && state.space.switch.visible && !state.space.switch.editable;
        announce(`Web search is ${on ? "on" : "off"} for space ${state.space.space_id}.${blocked ? ` ${state.space.switch.tooltip}` : ""}`);
      }
    });
  }

  async function saveConsolidation(event) {
    event.preventDefault();
    clearMessages();
    const field = $("max-tokens");
    const maxTokens = Number(field.value);
    if (!Number.isInteger(maxTokens) || maxTokens < MIN_TOKENS || maxTokens > MAX_TOKENS) {
      field.setAttribute("aria-invalid", "true");
      showAlert([
        el("p", { class: "alert-title" }, "The consolidation settings were not saved."),
        el("p", {}, `Max Tokens must be a whole number from ${MIN_TOKENS} to ${MAX_TOKENS}.`),
      ]);
      field.focus();
      return;
    }
    const change = {
      user_memory: {
        use_orchestrator_language_model: $("use-orchestrator").checked,
        language_model: $("language-model").value.trim(),
        max_tokens: maxTokens,
      },
    };
    await busy($("consolidation-save"), async () => {
      if (await changeSpace(change, "The consolidation settings were not saved.")) {
        announce(`The consolidation settings of space ${state.space.space_id} were saved.`);
      }
    });
  }

  // --- feature flags ------------------------------------------------------------------------

  async function loadFlags() {
    const answer = await json("GET", companyPath("/feature-flags"));
    $("flags").replaceChildren(...answer.flags.map(flagItem));
  }

  function flagItem(flag) {
    const button = el(
      "button",
      { type: "button", class: "switch", role: "switch", "aria-checked": flag.enabled ? "true" : "false", "data-flag": flag.flag },
      el("span", { class: "switch-track", "aria-hidden": "true" }, el("span", { class: "switch-thumb" })),
      el("span", { class: "switch-label flag-name" }, flag.flag),
    );
    const meta = flag.updated_at ? `Changed ${formatTime(flag.updated_at)} by ${flag.updated_by} (${flag.updated_by_company_id})` : "Never set (off)";
    button.addEventListener("click", () =>
      busy(button, async () => {
        clearMessages();
        const enabled = button.getAttribute("aria-checked") !== "true";
        try {
          await api("PUT", companyPath(`/feature-flags/${encodeURIComponent(flag.flag)}`), { body: { enabled } });
        } catch (error) {
          showProblem(error, `${flag.flag} was not changed.`);
          return;
        }
        await loadFlags();
        document.querySelector(`[data-flag="${CSS.escape(flag.flag)}"]`).focus();
        announce(`${flag.flag} is ${enabled ? "on" : "off"}.`);
      }),
    );
    return el("li", {}, el("div", { class: "row switch-row" }, button, el("span", { class: "switch-state" }, flag.enabled ? "On" : "Off")), el("p", { class: "meta" }, meta));
  }

  // --- memory policy ------------------------------------------------------------------------

  async function loadPolicy() {
    const policy = await json("GET", companyPath("/memory-policy"));
    const fields = Object.entries(POLICY_CATEGORIES).map(([key, label]) => {
      const select = el("select", { id: `policy-${key}` }, ...POLICY_ACTIONS.map((action) => el("option", { value: action }, action)));
      select.value = policy[key];
      return el("div", {}, el("label", { for: `policy-${key}` }, label), select);
    });
    for (const [key, label] of [["recent_topics_days", "Keep Recent Topics (days, 0: always)"], ["inactive_memory_days", "Erase idle memories after (days, 0: never)"]]) {
      const input = el("input", { id: `policy-${key}`, type: "number", min: "0", step: "1", inputmode: "numeric" });
      input.value = String(policy[key]);
      fields.push(el("div", {}, el("label", { for: `policy-${key}` }, label), input));
    }
    $("policy-fields").replaceChildren(...fields);
  }

  async function savePolicy(event) {
    event.preventDefault();
    clearMessages();
    const body = {};
    for (const key of Object.keys(POLICY_CATEGORIES)) body[key] = $(`policy-${key}`).value;
    for (const key of ["recent_topics_days", "inactive_memory_days"]) body[key] = Number($(`policy-${key}`).value);
    await busy($("policy-save"), async () => {
      try {
        await api("PUT", companyPath("/memory-policy"), { body });
      } catch (error) {
        showProblem(error, "The memory policy was not saved.");
        return;
      }
      announce("The memory policy was saved.");
    });
  }

  // --- rate limits --------------------------------------------------------------------------

  async function loadLimits() {
    const limits = await json("GET", companyPath("/rate-limits"));
    $("limits-meta").textContent = limits.default
      ? "Every limit is the service's default."
      : `Changed ${formatTime(limits.updated_at)} by ${limits.updated_by} (${limits.updated_by_company_id}).`;
    const sets = Object.entries(LIMIT_CLASSES).map(([key, label]) => {
      const scopes = Object.entries(LIMIT_SCOPES).map(([scope, scopeLabel]) => limitScope(key, scope, scopeLabel, limits[key][scope]));
      return el("fieldset", {}, el("legend", {}, label), ...scopes);
    });
    $("limits-fields").replaceChildren(...sets);
  }

  function limitScope(key, scope, label, current) {
    const id = `limit-${key}-${scope}`;
    const mode = el(
      "select",
      { id: `${id}-mode` },
      el("option", { value: "default" }, "Default"),
      el("option", { value: "limit" }, "Limit"),
      el("option", { value: "unlimited" }, "Unlimited"),
    );
    mode.value = !current.overridden ? "default" : current.limit === null ? "unlimited" : "limit";
    const quota = el("input", { id: `${id}-quota`, type: "number", min: "1", step: "1", inputmode: "numeric" });
    const window_ = el("input", { id: `${id}-window`, type: "number", min: "1", step: "1", inputmode: "numeric" });
    quota.value = current.limit ? String(current.limit.quota) : "";
    window_.value = current.limit ? String(current.limit.window_seconds) : "";
    return el(
      "div",
      { class: "limit-scope" },
      el("span", { class: "scope-name" }, label),
      el("div", {}, el("label", { for: `${id}-mode` }, `${label}: setting`), mode),
      el("div", {}, el("label", { for: `${id}-quota` }, "Requests"), quota),
      el("div", {}, el("label", { for: `${id}-window` }, "Per seconds"), window_),
    );
  }

  async function saveLimits(event) {
    event.preventDefault();
    clearMessages();
    const body = {};
    for (const key of Object.keys(LIMIT_CLASSES)) {
      for (const scope of Object.keys(LIMIT_SCOPES)) {
        const id = `limit-${key}-${scope}`;
        const mode = $(`${id}-mode`).value;
        if (mode === "default") continue;
        body[key] = body[key] || {};
        body[key][scope] = mode === "unlimited" ? "unlimited" : { quota: Number($(`${id}-quota`).value), window_seconds: Number($(`${id}-window`).value) };
      }
    }
    await busy($("limits-save"), async () => {
      try {
        await api("PUT", companyPath("/rate-limits"), { body });
      } catch (error) {
        showProblem(error, "The rate limits were not saved.");
        return;
      }
      await loadLimits();
      announce("The rate limits were saved.");
    });
  }

  // --- model budget -------------------------------------------------------------------------

  async function loadBudget() {
    const budget = await json("GET", companyPath("/model-budget"));
    $("budget-tokens").value = budget.monthly_tokens === null ? "" : String(budget.monthly_tokens);
    $("budget-when").value = budget.when_spent;
    const share = budget.used_share === null ? "no budget set" : `${Math.round(budget.used_share * 100)}% of the budget`;
    $("budget-meta").textContent = `This month (${budget.period_start} to ${budget.period_end}): ${formatNumber(budget.spent_tokens)} tokens spent, ${share}.`;
  }

  async function saveBudget(event) {
    event.preventDefault();
    clearMessages();
    const tokens = $("budget-tokens").value.trim();
    const body = { monthly_tokens: tokens === "" ? null : Number(tokens), when_spent: $("budget-when").value };
    await busy($("budget-save"), async () => {
      try {
        await api("PUT", companyPath("/model-budget"), { body });
      } catch (error) {
        showProblem(error, "The model budget was not saved.");
        return;
      }
      await loadBudget();
      announce("The model budget was saved.");
    });
  }

  // --- usage --------------------------------------------------------------------------------

  function isoDay(date) {
    return date.toISOString().slice(0, 10);
  }

  async function loadUsage() {
    if (!$("usage-to").value) {
      const today = new Date();
      $("usage-to").value = isoDay(today);
      $("usage-from").value = isoDay(new Date(today.getTime() - 29 * 86_400_000));
    }
    const query = new URLSearchParams({ from: $("usage-from").value, to: $("usage-to").value });
    renderUsage(await json("GET", `${companyPath("/usage")}?${query}`));
  }

  // Per day, per model: tokens (prompt + completion) and the estimated cost, over every kind.
  function usageSeries(report) {
    const models = [];
    const days = report.days.map((day) => {
      const byModel = {};
      for (const call of day.model_calls) {
        if (!models.includes(call.model)) models.push(call.model);
        const entry = byModel[call.model] || { tokens: 0, cost: 0, priced: true };
        entry.tokens += call.prompt_tokens + call.completion_tokens;
        entry.cost += call.estimated_cost || 0;
        entry.priced = entry.priced && call.estimated_cost !== null;
        byModel[call.model] = entry;
      }
      return { day: day.day, byModel };
    });
    models.sort(); // a model keeps its colour whatever order the days list it in
    return { models, days };
  }

  function renderUsage(report) {
    const series = usageSeries(report);
    const totals = report.totals;
    const cost = totals.estimated_cost === null ? "cost unknown" : `estimated cost ${totals.estimated_cost.toFixed(2)}`;
    $("usage-totals").textContent =
      `${report.from} to ${report.to}: ${formatNumber(totals.turns_saved)} turns, ${formatNumber(totals.contexts_served)} contexts, ` +
      `${formatNumber(totals.prompt_tokens + totals.completion_tokens)} model tokens, ${cost}.` +
      (report.unpriced_models.length ? ` No price for: ${report.unpriced_models.join(", ")}.` : "");
    drawChart($("tokens-chart"), series, "tokens", "tokens-caption", (value) => formatNumber(Math.round(value)));
    drawChart($("cost-chart"), series, "cost", "cost-caption", (value) => value.toFixed(2));
    $("usage-legend").replaceChildren(
      ...series.models.map((model, index) => el("li", {}, el("span", { class: `swatch series-${index % 8}`, "aria-hidden": "true" }), model)),
    );
    const rows = series.days.flatMap(({ day, byModel }) =>
      Object.entries(byModel).map(([model, entry]) => el("tr", {}, el("td", {}, day), el("td", {}, model), el("td", {}, formatNumber(entry.tokens)), el("td", {}, entry.priced ? entry.cost.toFixed(4) : "no price"))),
    );
    $("usage-rows").replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: "4" }, "No model calls in this range."))]));
  }

  // A stacked bar per day, one colour per model; the figures are in the table below it.
  function drawChart(box, series, measure, captionId, format) {
    const width = 640;
    const height = 220;
    const left = 56;
    const bottom = 28;
    const top = 10;
    const plotHeight = height - top - bottom;
    const totals = series.days.map(({ byModel }) => Object.values(byModel).reduce((sum, entry) => sum + entry[measure], 0));
    const highest = Math.max(0, ...totals);
    const scale = highest > 0 ? plotHeight / highest : 0;
    const slot = (width - left - 8) / Math.max(1, series.days.length);
    const bar = Math.max(1, slot * 0.7);
    const summary = highest > 0 ? `Highest day: ${format(highest)}.` : "Nothing in this range.";
    const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-labelledby": captionId });
    chart.append(svg("title", {}, `${$(captionId).textContent}. ${summary}`));
    chart.append(svg("line", { class: "axis", x1: left, y1: top, x2: left, y2: top + plotHeight }));
    chart.append(svg("line", { class: "axis", x1: left, y1: top + plotHeight, x2: width, y2: top + plotHeight }));
    chart.append(svg("text", { x: left - 4, y: top + 8, "text-anchor": "end" }, format(highest)));
    chart.append(svg("text", { x: left - 4, y: top + plotHeight, "text-anchor": "end" }, "0"));
    series.days.forEach(({ day, byModel }, index) => {
      const x = left + 4 + index * slot;
      let y = top + plotHeight;
      series.models.forEach((model, modelIndex) => {
        const value = byModel[model] ? byModel[model][measure] : 0;
        if (!value) return;
        const barHeight = value * scale;
        y -= barHeight;
        const rect = svg("rect", { class: `series-${modelIndex % 8}`, x: x.toFixed(1), y: y.toFixed(1), width: bar.toFixed(1), height: barHeight.toFixed(1), "data-model": model, "data-day": day });
        rect.append(svg("title", {}, `${day}, ${model}: ${format(value)}`));
        chart.append(rect);
      });
    });
    const first = series.days[0];
    const last = series.days.at(-1);
    if (first) chart.append(svg("text", { x: left + 4, y: height - 8 }, first.day));
    if (last && last !== first) chart.append(svg("text", { x: width - 4, y: height - 8, "text-anchor": "end" }, last.day));
    box.replaceChildren(chart);
  }

  // --- jobs ---------------------------------------------------------------------------------

  async function loadJobs(reset) {
    if (reset) {
      state.cursors.jobs = null;
      $("jobs").replaceChildren();
    }
    const query = new URLSearchParams({ limit: String(PAGE_SIZE) });
    if ($("jobs-status").value) query.set("status", $("jobs-status").value);
    if (state.cursors.jobs) query.set("cursor", state.cursors.jobs);
    const page = await json("GET", `${companyPath("/jobs")}?${query}`);
    $("jobs").append(...page.items.map(jobRow));
    state.cursors.jobs = page.next_cursor;
    $("jobs-more").hidden = !page.next_cursor;
    $("jobs-table").hidden = $("jobs").children.length === 0;
    $("jobs-empty").hidden = $("jobs").children.length > 0;
  }

  function jobRow(job) {
    const error = job.error ? `${job.error.class}: ${job.error.message}` : "—";
    const actions = el("td", {});
    if (job.status === "dead") {
      const retry = el("button", { type: "button", class: "secondary" }, `Retry job ${job.id.slice(0, 8)}`);
      retry.addEventListener("click", () =>
        busy(retry, async () => {
          clearMessages();
          try {
            await api("POST", companyPath(`/jobs/${encodeURIComponent(job.id)}/retry`));
          } catch (error) {
            showProblem(error, "The job was not retried.");
            return;
          }
          await loadJobs(true);
          announce(`Job ${job.id.slice(0, 8)} was queued again.`);
          $("jobs-heading").focus();
        }),
      );
      actions.append(retry);
    }
    return el(
      "tr",
      { "data-job": job.id },
      el("td", {}, `${job.kind} ${job.id.slice(0, 8)} · ${job.user_id} · ${formatTime(job.created_at)}`),
      el("td", {}, job.status),
      el("td", {}, `${job.attempts} of ${job.max_attempts}`),
      el("td", {}, error),
      actions,
    );
  }

  // --- audit log and erasures ---------------------------------------------------------------

  function auditItem(event) {
    const change = event.old || event.new ? ` ${describeChange(event.old)} → ${describeChange(event.new)}` : "";
    return el(
      "li",
      {},
      el("strong", {}, event.action),
      ` ${event.target_kind} ${event.target_id}${change}`,
      el("p", { class: "meta" }, `${formatTime(event.occurred_at)} by ${event.actor_id} (${event.actor_company_id})`),
    );
  }

  async function loadAudit(reset) {
    if (reset) {
      state.cursors.audit = null;
      $("audit").replaceChildren();
    }
    const query = new URLSearchParams({ limit: String(PAGE_SIZE) });
    if (state.cursors.audit) query.set("cursor", state.cursors.audit);
    const page = await json("GET", `${companyPath("/audit-events")}?${query}`);
    $("audit").append(...page.items.map(auditItem));
    state.cursors.audit = page.next_cursor;
    $("audit-more").hidden = !page.next_cursor;
    $("audit-empty").hidden = $("audit").children.length > 0;
  }

  // The receipts: the audit log's `user.erased` events (counts only), newest first.
  async function loadErasures() {
    const present = hasRoute(ROUTES.eraseUser);
    $("erasure-form").hidden = !present;
    $("erasure-absent").hidden = present;
    $("erasure-absent").textContent = NEEDS_COMPANY_ROUTES;
    const found = [];
    let cursor = null;
    for (let pages = 0; pages < 5; pages += 1) {
      const query = new URLSearchParams({ limit: "100" });
      if (cursor) query.set("cursor", cursor);
      const page = await json("GET", `${companyPath("/audit-events")}?${query}`);
      found.push(...page.items.filter((event) => event.action === "user.erased"));
      cursor = page.next_cursor;
      if (!cursor) break;
    }
    $("erasures").replaceChildren(...found.map(auditItem));
    $("erasures-empty").hidden = found.length > 0;
  }

  async function eraseUser(event) {
    event.preventDefault();
    clearMessages();
    const user = $("erasure-user").value.trim();
    if (!user) return;
    const confirmed = await confirmTyped({
      title: `Erase ${user}?`,
      text: `This permanently deletes ${user}'s memory, its versions, chats and jobs in ${state.company}, and anonymises their edits of company settings.`,
      label: `Type the user id (${user}) to confirm`,
      expected: user,
      ok: "Erase user",
    });
    if (!confirmed) {
      announce(`${user} was not erased.`);
      return;
    }
    let receipt;
    try {
      receipt = await json("DELETE", path(ROUTES.eraseUser, { company_id: state.company, user_id: user }));
    } catch (error) {
      showProblem(error, `${user} was not erased.`);
      return;
    }
    $("erasure-user").value = "";
    await loadErasures();
    const counts = flatten(receipt || {}).map(([key, value]) => `${key}: ${value}`).join(", ");
    announce(`${user} was erased. ${counts}`);
  }

  // --- wiring -------------------------------------------------------------------------------

  function wireForms() {
    $("open-space-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const id = $("open-space").value.trim();
      if (id) openSpace(id);
    });
    $("open-company-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const id = $("open-company").value.trim();
      if (id) openCompany(id);
    });
    $("context-memory-switch").addEventListener("click", toggleContextMemory);
    for (const name of ["mouseenter", "focus"]) $("context-memory-switch").addEventListener(name, () => showTooltip(true));
    for (const name of ["mouseleave", "blur"]) $("context-memory-switch").addEventListener(name, () => showTooltip(false));
    $("context-memory-switch").addEventListener("keydown", (event) => event.key === "Escape" && showTooltip(false));
    $("web-search-switch").addEventListener("click", toggleWebSearch);
    $("consolidation-form").addEventListener("submit", saveConsolidation);
    $("policy-form").addEventListener("submit", savePolicy);
    $("limits-form").addEventListener("submit", saveLimits);
    $("budget-form").addEventListener("submit", saveBudget);
    $("usage-form").addEventListener("submit", (event) => {
      event.preventDefault();
      clearMessages();
      loadUsage().catch((error) => showProblem(error, "The usage could not be loaded."));
    });
    $("jobs-form").addEventListener("submit", (event) => {
      event.preventDefault();
      clearMessages();
      loadJobs(true).catch((error) => showProblem(error, "The jobs could not be loaded."));
    });
    $("erasure-form").addEventListener("submit", eraseUser);
    const more = { "jobs-more": () => loadJobs(false), "audit-more": () => loadAudit(false), "companies-more": () => loadCompanies(false) };
    for (const [id, load] of Object.entries(more)) {
      $(id).addEventListener("click", (event) => busy(event.currentTarget, () => load().catch((error) => showProblem(error, "More could not be loaded."))));
    }
    $("back-to-companies").addEventListener("click", () => showPage("companies"));
  }

  async function start() {
    $("token-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const token = $("token").value.trim();
      $("token").value = "";
      if (!token) {
        $("token").focus();
        return;
      }
      useToken(token); // focuses the first page's heading
    });
    $("forget-token").addEventListener("click", forgetToken);
    $("sign-in-button").addEventListener("click", (event) => busy(event.currentTarget, startSignIn));
    $("sign-out").addEventListener("click", signOut);
    wireForms();
    window.addEventListener("hashchange", tokenFromChangedFragment);
    const returned = signIn.takeAnswer();
    const linked = ContextMemorySignIn.tokenFromFragment(); // out of the address bar now, used or not
    if (await signIn.loadConfig()) {
      $("token-heading").textContent = "Your account";
      $("token-label").textContent = "Or, for development, paste a token";
      $("sign-in").hidden = false;
    }
    if (linked) tokenFromOpeningLink(linked);
    if (returned) await completeSignIn(returned);
  }

  start();
})();
