// Signing in with the company's OpenID provider, shared by the pages of /ui (the memory page and
// the admin console): loaded before the page's own script, it defines `ContextMemorySignIn`.
//
// The authorization code flow with PKCE (S256), the page a public client whose redirect URI
// is its own address. The provider's discovery document and token endpoint are fetched (the
// Content-Security-Policy allows the issuer's origin for exactly that); the authorization
// request and the sign-out are navigations. The ID token is only read for its nonce, issuer
// and audience: the service verifies the access token, which is what the page sends it.
// Only what must survive the redirect to the provider (state, nonce, code verifier) waits in
// sessionStorage, under the page's own key, and is removed as soon as the page is back.
//
// This module never touches the page: it answers URLs, tokens and `SignInError`s (a title and
// a sentence a person can read), and the page decides what to show.
"use strict";

const ContextMemorySignIn = (() => {
  const CALLBACK_PARAMS = ["code", "state", "iss", "session_state", "error", "error_description", "error_uri"];
  const NOT_AVAILABLE = "Sign-in is not available right now.";
  const REFUSED = "You were not signed in.";

  class SignInError extends Error {
    constructor(title, detail) {
      super(title);
      this.title = title;
      this.detail = detail;
    }
  }

  function pageUrl() {
    return location.origin + location.pathname;
  }

  function isHttpUrl(value) {
    if (typeof value !== "string") return false;
    try {
      return ["http:", "https:"].includes(new URL(value).protocol);
    } catch {
      return false;
    }
  }

  function base64url(bytes) {
    let binary = "";
    for (const byte of bytes) binary += String.fromCharCode(byte);
    return btoa(binary).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }

  function randomString(bytes) {
    return base64url(crypto.getRandomValues(new Uint8Array(bytes)));
  }

  async function codeChallenge(verifier) {
    const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier));
    return base64url(new Uint8Array(digest));
  }

  // The claims of a JWT, read without checking its signature (see above).
  function claimsOf(jwt) {
    try {
      const part = String(jwt).split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
      const binary = atob(part + "=".repeat((4 - (part.length % 4)) % 4));
      const claims = JSON.parse(new TextDecoder().decode(Uint8Array.from(binary, (c) => c.charCodeAt(0))));
      return claims && typeof claims === "object" ? claims : null;
    } catch {
      return null;
    }
  }

  async function fetchJson(url, init, title) {
    let response;
    try {
      response = await fetch(url, {
        cache: "no-store",
        credentials: "omit",
        referrerPolicy: "no-referrer",
        ...init,
        headers: { Accept: "application/json", ...(init && init.headers) },
      });
    } catch {
      throw new SignInError(title, "The sign-in service could not be reached. Check your connection and try again.");
    }
    let body = null;
    try {
      body = await response.json();
    } catch {
      body = null;
    }
    return { response, body: body && typeof body === "object" ? body : null };
  }

  // The token in the fragment, if any, taken out of the address bar (and so out of the history)
  // before anything else happens, whether it is then used or not: the caller decides.
  function tokenFromFragment() {
    if (!location.hash) return null;
    const token = new URLSearchParams(location.hash.slice(1)).get("token");
    history.replaceState(null, "", location.pathname + location.search);
    return token && token.trim() ? token.trim() : null;
  }

  // One page's sign-in: `storageKey` names what waits in sessionStorage across the redirect,
  // `configUrl` is the page's /ui/config.json.
  function create({ storageKey, configUrl }) {
    const signIn = {
      config: null, // {issuer, client_id, scope, extra_params} from /ui/config.json, or null
      configKnown: false, // /ui/config.json was read, so `config: null` means "no sign-in"
      discovery: null, // the provider's OpenID configuration, once fetched
      viaProvider: false, // the token in use came from signing in
    };

    async function loadConfig() {
      try {
        const response = await fetch(configUrl, { cache: "no-store", credentials: "omit", headers: { Accept: "application/json" } });
        const body = response.ok ? await response.json() : null;
        const config = body && typeof body === "object" ? body.sign_in : undefined;
        // known only from an answer that says either way: sign-in (an object) or none (null)
        signIn.configKnown = typeof config === "object";
        signIn.config = config && typeof config === "object" ? config : null;
      } catch {
        signIn.config = null;
      }
      return signIn.config;
    }

    async function discover() {
      if (signIn.discovery) return signIn.discovery;
      const issuer = signIn.config.issuer;
      const url = `${issuer.replace(/\/+$/, "")}/.well-known/openid-configuration`;
      const { response, body } = await fetchJson(url, {}, NOT_AVAILABLE);
      if (!response.ok || !body) {
        throw new SignInError(NOT_AVAILABLE, `The sign-in service answered ${response.status} when asked for its configuration.`);
      }
      if (body.issuer !== issuer) {
        throw new SignInError(NOT_AVAILABLE, "The sign-in service names an issuer other than the one this page trusts, so the page does not use it.");
      }
      if (!isHttpUrl(body.authorization_endpoint) || !isHttpUrl(body.token_endpoint)) {
        throw new SignInError(NOT_AVAILABLE, "The sign-in service's configuration lacks its authorization or token endpoint.");
      }
      if (new URL(body.token_endpoint).origin !== new URL(issuer).origin) {
        throw new SignInError(NOT_AVAILABLE, "The sign-in service's token endpoint is not at the issuer's address, the only one this page may call.");
      }
      const methods = body.code_challenge_methods_supported;
      if (Array.isArray(methods) && !methods.includes("S256")) {
        throw new SignInError(NOT_AVAILABLE, "The sign-in service does not support PKCE with S256, which this page requires.");
      }
      signIn.discovery = body;
      return body;
    }

    // The authorization request's URL, with what the answer is checked against kept in
    // sessionStorage; the page navigates to it. Throws a SignInError.
    async function authorizationUrl() {
      const config = signIn.config;
      const pending = { issuer: config.issuer, state: randomString(32), nonce: randomString(32), verifier: randomString(48) };
      if (!window.isSecureContext) {
        throw new SignInError(NOT_AVAILABLE, "Signing in needs this page to be opened over HTTPS.");
      }
      const discovery = await discover();
      const url = new URL(discovery.authorization_endpoint);
      for (const [name, value] of Object.entries(config.extra_params || {})) url.searchParams.set(name, value);
      const request = {
        response_type: "code",
        client_id: config.client_id,
        redirect_uri: pageUrl(),
        scope: config.scope,
        state: pending.state,
        nonce: pending.nonce,
        code_challenge: await codeChallenge(pending.verifier),
        code_challenge_method: "S256",
      };
      for (const [name, value] of Object.entries(request)) url.searchParams.set(name, value);
      try {
        sessionStorage.setItem(storageKey, JSON.stringify(pending));
      } catch {
        const detail = "This browser does not let the page keep the sign-in across the visit to the sign-in service (session storage is off).";
        throw new SignInError(NOT_AVAILABLE, detail);
      }
      return url.href;
    }

    // The provider's answer, if the page was sent back with one: taken out of the address bar
    // (and so out of the history) and the pending sign-in out of storage, before anything else.
    // Storage is emptied on every visit, so a sign-in given up at the provider leaves nothing.
    function takeAnswer() {
      let kept = null;
      try {
        kept = sessionStorage.getItem(storageKey);
        sessionStorage.removeItem(storageKey);
      } catch {
        kept = null; // storage is off: there is no pending sign-in
      }
      let pending = null;
      try {
        pending = JSON.parse(kept || "null");
      } catch {
        pending = null;
      }
      const query = new URLSearchParams(location.search);
      if (!query.has("code") && !query.has("error")) return null;
      const answer = {};
      for (const name of CALLBACK_PARAMS) {
        if (query.has(name)) answer[name] = query.get(name);
        query.delete(name);
      }
      const rest = query.toString();
      history.replaceState(null, "", location.pathname + (rest ? `?${rest}` : "") + location.hash);
      return { answer, pending };
    }

    // The access token for the answer, or a SignInError saying why there is none.
    async function redeem({ answer, pending }) {
      const config = signIn.config;
      if (!config) throw new SignInError(REFUSED, "This page no longer offers sign-in.");
      if (!pending || typeof pending !== "object" || pending.issuer !== config.issuer) {
        throw new SignInError(REFUSED, "This page did not start this sign-in, or its answer was already used. Sign in again.");
      }
      if (answer.state !== pending.state) {
        throw new SignInError(REFUSED, "The answer from the sign-in service does not belong to the sign-in this page started (its state does not match), so the page refused it. Sign in again.");
      }
      if (answer.error) {
        throw new SignInError(REFUSED, `The sign-in service answered: ${answer.error_description || answer.error}.`);
      }
      if ("iss" in answer && answer.iss !== config.issuer) {
        throw new SignInError(REFUSED, "The answer came from an issuer other than the one this page trusts, so the page refused it.");
      }
      const discovery = await discover();
      const form = new URLSearchParams({
        grant_type: "authorization_code",
        code: answer.code || "",
        redirect_uri: pageUrl(),
        client_id: config.client_id,
        code_verifier: pending.verifier,
      });
      const { response, body } = await fetchJson(
        discovery.token_endpoint,
        { method: "POST", headers: { "Content-Type": "application/x-www-form-urlencoded" }, body: form },
        REFUSED,
      );
      if (!response.ok || !body) {
        const reason = (body && (body.error_description || body.error)) || `it answered ${response.status}`;
        throw new SignInError(REFUSED, `The sign-in service issued no token: ${reason}. Sign in again.`);
      }
      if (typeof body.access_token !== "string" || !body.access_token) {
        throw new SignInError(REFUSED, "The sign-in service issued no access token.");
      }
      if (typeof body.token_type === "string" && body.token_type.toLowerCase() !== "bearer") {
        throw new SignInError(REFUSED, `The sign-in service issued a ${body.token_type} token; this page needs a bearer token.`);
      }
      if (body.id_token !== undefined) {
        const claims = claimsOf(body.id_token);
        if (!claims || claims.nonce !== pending.nonce) {
          throw new SignInError(REFUSED, "The sign-in service's answer was not made for this sign-in (its nonce does not match), so the page refused it. Sign in again.");
        }
        const audiences = Array.isArray(claims.aud) ? claims.aud : [claims.aud];
        if (claims.iss !== config.issuer || !audiences.includes(config.client_id)) {
          throw new SignInError(REFUSED, "The sign-in service's answer names another issuer or client, so the page refused it.");
        }
      }
      return body.access_token;
    }

    // Where to send the browser to end the provider's session too (it comes back to this page
    // signed out), or null when the provider offers no such thing.
    function endSessionUrl() {
      const endSession = signIn.discovery && signIn.discovery.end_session_endpoint;
      if (!signIn.config || !isHttpUrl(endSession)) return null;
      const url = new URL(endSession);
      url.searchParams.set("client_id", signIn.config.client_id);
      url.searchParams.set("post_logout_redirect_uri", pageUrl());
      return url.href;
    }

    return Object.assign(signIn, { loadConfig, authorizationUrl, takeAnswer, redeem, endSessionUrl });
  }

  // A page's two steps of the sign-in, the same on every page: `start` sends the browser to the
  // company's sign-in page; `complete` redeems the answer it came back with and hands the access
  // token to the page's `useToken`, whose result it returns (false: not signed in). The page
  // says how it speaks: `announce`, `clearMessages`, `showProblem`.
  function flow(signIn, { announce, clearMessages, showProblem, useToken }) {
    async function start() {
      clearMessages();
      let url;
      try {
        url = await signIn.authorizationUrl();
      } catch (error) {
        showProblem(error);
        return;
      }
      announce("Taking you to your company's sign-in page…");
      location.assign(url);
    }

    async function complete(returned) {
      announce("Signing you in…");
      let accessToken;
      try {
        accessToken = await signIn.redeem(returned);
      } catch (error) {
        announce("");
        showProblem(error);
        return false;
      }
      const what = "You signed in, but this service did not accept your sign-in.";
      return useToken(accessToken, { viaProvider: true, what });
    }

    return { start, complete };
  }

  return { SignInError, create, flow, tokenFromFragment };
})();
