// A real OpenID Provider (panva's oidc-provider) for the identity tests, on loopback only.
//
//   node provider.mjs --config provider.json [--port 0]
//
// The JSON file (or PROVIDER_CONFIG, a path; PROVIDER_PORT for the port) configures it:
//   issuer            default http://127.0.0.1:<port>, known once the port is bound
//   audience          `aud` of access tokens unless the resource indicator names another
//   algorithms        one signing key is generated per algorithm at start (RS256, ES256, ...)
//   default_algorithm access tokens' algorithm unless the resource indicator names another
//   access_token_ttl  seconds
//   jwks_max_age      Cache-Control max-age of the JWKS in seconds; null sends no-store
//   cors_origins      origins allowed on the token endpoint besides the clients' redirect origins
//   clients           oidc-provider client metadata, as registered (snake_case)
//   accounts          {login: claims}; the claims are copied into the access token. The login
//                     form accepts any login and password; an unknown login has only `sub`.
//
// Access tokens are JWTs for the resource indicator the client asks for: any absolute URI,
// whose query may pick the token's audience and algorithm (`?aud=context-memory&alg=ES256`);
// without one the provider defaults to its audience and default algorithm.
//
// Once listening it prints one JSON line on stdout: {"issuer": ..., "port": ...}.
//
// Test-only endpoints under /__test__/ (answered to loopback peers only) change it while the
// HTTP server keeps running; a change of keys or clients builds a new Provider instance behind
// the same server, sharing one store of sessions, interactions and codes:
//   GET    /__test__/keys               [{kid, alg, signing}]
//   POST   /__test__/keys {alg}         a new key published next to the others (not signing)
//   POST   /__test__/keys/<kid>/sign    access tokens of that algorithm signed with this key
//   DELETE /__test__/keys/<kid>         the key withdrawn from the JWKS (not while signing)
//   PUT    /__test__/accounts/<login>   the account's claims replaced
//   POST   /__test__/clients {...}      a client registered (or replaced, by client_id)
//   PUT    /__test__/jwks-cache {max_age}
//   GET    /__test__/stats              {jwks_requests, tokens_issued}

import { createPrivateKey, generateKeyPairSync, randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { parseArgs } from 'node:util';

import Provider, { errors } from 'oidc-provider';

const HOST = '127.0.0.1';
const RESOURCE_SCOPE = 'memory';
const LOOPBACK = new Set(['127.0.0.1', '::1', '::ffff:127.0.0.1']);

const { values: args } = parseArgs({
  options: { config: { type: 'string' }, port: { type: 'string' } },
});
const configPath = args.config ?? process.env.PROVIDER_CONFIG;
const config = configPath ? JSON.parse(readFileSync(configPath, 'utf8')) : {};
const port = Number(args.port ?? process.env.PROVIDER_PORT ?? config.port ?? 0);

const audience = config.audience ?? 'context-memory';
const algorithms = config.algorithms ?? ['RS256', 'ES256'];
const defaultAlgorithm = config.default_algorithm ?? algorithms[0];
const accessTokenTTL = config.access_token_ttl ?? 600;
const corsOrigins = new Set(config.cors_origins ?? []);
const accounts = new Map(Object.entries(config.accounts ?? {}));
const clients = new Map((config.clients ?? []).map((client) => [client.client_id, client]));
// cookie signing keys outlive Provider instances, so sign-ins in flight survive a rebuild
const cookieKeys = [randomBytes(32).toString('base64url')];

const stats = { jwks_requests: 0, tokens_issued: 0 };
let jwksMaxAge = config.jwks_max_age === undefined ? 300 : config.jwks_max_age;

// --- keys ---------------------------------------------------------------------------------

const keys = []; // {kid, alg, jwk (private)}, in publication order
const signing = new Map(); // alg -> kid
let keySerial = 0;

function generateKey(alg) {
  // PEM out of the generator, then a key object of its own: Node 20 can deadlock exporting a
  // JWK straight from a generated key when the collector reaps the generator meanwhile
  const encoding = {
    privateKeyEncoding: { type: 'pkcs8', format: 'pem' },
    publicKeyEncoding: { type: 'spki', format: 'pem' },
  };
  let pair;
  if (alg.startsWith('RS') || alg.startsWith('PS')) {
    pair = generateKeyPairSync('rsa', { modulusLength: 2048, ...encoding });
  } else if (alg.startsWith('ES')) {
    const curve = { ES256: 'P-256', ES384: 'P-384', ES512: 'P-521' }[alg];
    if (!curve) throw new Error(`unsupported algorithm ${alg}`);
    pair = generateKeyPairSync('ec', { namedCurve: curve, ...encoding });
  } else {
    throw new Error(`unsupported algorithm ${alg}`);
  }
  keySerial += 1;
  const kid = `${alg.toLowerCase()}-${keySerial}-${randomBytes(4).toString('hex')}`;
  const exported = createPrivateKey(pair.privateKey).export({ format: 'jwk' });
  const jwk = { ...exported, kid, alg, use: 'sig' };
  const key = { kid, alg, jwk };
  keys.push(key);
  return key;
}

function publishedKeys() {
  // the signing key of each algorithm first: it is also the one ID tokens are signed with
  const isSigning = (key) => signing.get(key.alg) === key.kid;
  return [...keys.filter(isSigning), ...keys.filter((key) => !isSigning(key))].map((k) => k.jwk);
}

for (const alg of algorithms) {
  signing.set(alg, generateKey(alg).kid);
}

// --- the store ------------------------------------------------------------------------------

// oidc-provider's own memory adapter keeps one store per Provider instance; this one is shared
// by all of them, so sign-ins, codes and grants survive a rebuild.
const store = new Map(); // key -> {payload, expiresAt}
const grantMembers = new Map(); // grantId -> keys of the tokens issued under it
const GRANTABLE = new Set(['AccessToken', 'AuthorizationCode', 'RefreshToken', 'DeviceCode',
  'BackchannelAuthenticationRequest']);

function stored(key) {
  const entry = store.get(key);
  if (entry && entry.expiresAt <= Date.now()) store.delete(key);
  return store.get(key)?.payload;
}

function put(key, payload, expiresIn) {
  const expiresAt = typeof expiresIn === 'number' ? Date.now() + expiresIn * 1000 : Infinity;
  store.set(key, { payload, expiresAt });
}

class SharedAdapter {
  constructor(model) {
    this.model = model;
  }

  key(id) {
    return `${this.model}:${id}`;
  }

  async upsert(id, payload, expiresIn) {
    put(this.key(id), payload, expiresIn);
    if (this.model === 'Session') put(`sessionUid:${payload.uid}`, id, expiresIn);
    if (payload.userCode) put(`userCode:${payload.userCode}`, id, expiresIn);
    if (GRANTABLE.has(this.model) && payload.grantId) {
      const members = grantMembers.get(payload.grantId) ?? new Set();
      grantMembers.set(payload.grantId, members.add(this.key(id)));
    }
  }

  async find(id) {
    return stored(this.key(id));
  }

  async findByUid(uid) {
    const id = stored(`sessionUid:${uid}`);
    return id === undefined ? undefined : this.find(id);
  }

  async findByUserCode(userCode) {
    const id = stored(`userCode:${userCode}`);
    return id === undefined ? undefined : this.find(id);
  }

  async consume(id) {
    const payload = stored(this.key(id));
    if (payload) payload.consumed = Math.floor(Date.now() / 1000);
  }

  async destroy(id) {
    store.delete(this.key(id));
  }

  async revokeByGrantId(grantId) {
    for (const key of grantMembers.get(grantId) ?? []) store.delete(key);
    grantMembers.delete(grantId);
  }
}

setInterval(() => {
  for (const key of store.keys()) stored(key);
  for (const [grantId, members] of grantMembers) {
    for (const key of members) if (!store.has(key)) members.delete(key);
    if (!members.size) grantMembers.delete(grantId);
  }
}, 60_000).unref();

// --- the provider -------------------------------------------------------------------------

function claimsOf(login) {
  const claims = { ...(accounts.get(login) ?? {}) };
  delete claims.sub;
  return claims;
}

function resourceServerInfo(indicator) {
  const url = URL.parse(indicator);
  const alg = url?.searchParams.get('alg') ?? defaultAlgorithm;
  const kid = signing.get(alg);
  if (!kid) throw new errors.InvalidTarget(`no signing key for ${alg}`);
  return {
    scope: RESOURCE_SCOPE,
    audience: url?.searchParams.get('aud') ?? audience,
    accessTokenFormat: 'jwt',
    accessTokenTTL,
    jwt: { sign: { alg, kid } },
  };
}

function allowedOrigin(origin, client) {
  if (corsOrigins.has(origin)) return true;
  return client.redirectUris.some((uri) => URL.parse(uri)?.origin === origin);
}

function buildProvider(issuer) {
  const provider = new Provider(issuer, {
    adapter: SharedAdapter,
    clients: [...clients.values()],
    jwks: { keys: publishedKeys() },
    cookies: { keys: cookieKeys },
    pkce: { required: () => true },
    findAccount: (ctx, id) => ({
      accountId: id,
      claims: () => ({ sub: id, ...claimsOf(id) }),
    }),
    claims: { openid: ['sub'] },
    scopes: ['openid', 'offline_access', RESOURCE_SCOPE],
    clientBasedCORS: (ctx, origin, client) => allowedOrigin(origin, client),
    extraTokenClaims: (ctx, token) => (token.accountId ? claimsOf(token.accountId) : undefined),
    features: {
      devInteractions: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: (ctx, client, oneOf) => oneOf ?? `${issuer}/resources/default`,
        useGrantedResource: () => true,
        getResourceServerInfo: (ctx, indicator) => resourceServerInfo(indicator),
      },
    },
    enabledJWA: { idTokenSigningAlgValues: algorithms },
    ttl: {
      AccessToken: accessTokenTTL,
      AuthorizationCode: 60,
      Grant: 3600,
      IdToken: 3600,
      Interaction: 600,
      Session: 3600,
    },
  });
  provider.on('server_error', (ctx, error) => console.error('server_error', error));
  provider.use(async (ctx, next) => {
    await next();
    if (ctx.oidc?.route === 'jwks' && ctx.method === 'GET') {
      stats.jwks_requests += 1;
      ctx.set('cache-control', jwksMaxAge === null ? 'no-store' : `max-age=${jwksMaxAge}`);
    }
    if (ctx.oidc?.route === 'token' && ctx.status === 200) stats.tokens_issued += 1;
  });
  return provider;
}

// --- the test-only endpoints ----------------------------------------------------------------

async function readJson(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  const text = Buffer.concat(chunks).toString('utf8');
  return text ? JSON.parse(text) : {};
}

function send(res, status, body) {
  res.writeHead(status, { 'content-type': 'application/json', 'cache-control': 'no-store' });
  res.end(JSON.stringify(body));
}

function keyList() {
  return keys.map(({ kid, alg }) => ({ kid, alg, signing: signing.get(alg) === kid }));
}

async function testEndpoint(req, res, rebuild) {
  const path = new URL(req.url, 'http://loopback').pathname.split('/').slice(2);
  const route = `${req.method} ${path[0] ?? ''}`;
  const findKey = () => keys.find((key) => key.kid === decodeURIComponent(path[1] ?? ''));

  if (route === 'GET keys' && path.length === 1) return send(res, 200, keyList());
  if (route === 'POST keys' && path.length === 1) {
    const { alg } = await readJson(req);
    if (!algorithms.includes(alg)) return send(res, 400, { error: `unknown algorithm ${alg}` });
    const { kid } = generateKey(alg);
    rebuild();
    return send(res, 201, { kid, alg, signing: false });
  }
  if (route === 'POST keys' && path.length === 3 && path[2] === 'sign') {
    const key = findKey();
    if (!key) return send(res, 404, { error: 'unknown kid' });
    signing.set(key.alg, key.kid);
    rebuild();
    return send(res, 200, { kid: key.kid, alg: key.alg, signing: true });
  }
  if (route === 'DELETE keys' && path.length === 2) {
    const key = findKey();
    if (!key) return send(res, 404, { error: 'unknown kid' });
    if (signing.get(key.alg) === key.kid) {
      return send(res, 409, { error: 'the key still signs; sign with another first' });
    }
    keys.splice(keys.indexOf(key), 1);
    rebuild();
    return send(res, 200, { kid: key.kid, alg: key.alg, signing: false });
  }
  if (route === 'PUT accounts' && path.length === 2) {
    accounts.set(decodeURIComponent(path[1]), await readJson(req));
    return send(res, 200, { login: decodeURIComponent(path[1]) });
  }
  if (route === 'POST clients' && path.length === 1) {
    const client = await readJson(req);
    try {
      await buildProvider(issuer).Client.validate(client); // static clients: checked on use
    } catch (error) {
      return send(res, 400, { error: `${error.message}: ${error.error_description ?? ''}` });
    }
    clients.set(client.client_id, client);
    rebuild();
    return send(res, 201, { client_id: client.client_id });
  }
  if (route === 'PUT jwks-cache' && path.length === 1) {
    const { max_age: maxAge } = await readJson(req);
    jwksMaxAge = maxAge ?? null;
    return send(res, 200, { max_age: jwksMaxAge });
  }
  if (route === 'GET stats' && path.length === 1) return send(res, 200, stats);
  return send(res, 404, { error: `no test endpoint ${req.method} ${req.url}` });
}

// --- the HTTP server ------------------------------------------------------------------------

// The sign-in pages import a web font from the internet; blanked (same length, so the
// Content-Length holds) a browser driving them reaches nothing but this server.
const WEB_FONT = /@import url\(https:\/\/fonts\.googleapis\.com\/[^)]*\);?/g;

function blankWebFonts(res) {
  const end = res.end.bind(res);
  const blank = (text) => text.replace(WEB_FONT, (found) => ' '.repeat(found.length));
  res.end = (chunk, ...rest) => {
    if (typeof chunk === 'string') return end(blank(chunk), ...rest);
    if (Buffer.isBuffer(chunk)) {
      return end(Buffer.from(blank(chunk.toString('latin1')), 'latin1'), ...rest);
    }
    return end(chunk, ...rest);
  };
}

let handler = null;
let issuer = null;

function rebuild() {
  handler = buildProvider(issuer).callback();
}

const server = createServer((req, res) => {
  if (req.url.startsWith('/__test__/')) {
    if (!LOOPBACK.has(req.socket.remoteAddress) || req.headers.origin) {
      return send(res, 403, { error: 'test endpoints answer loopback callers only' });
    }
    return testEndpoint(req, res, rebuild).catch((error) => {
      console.error(error);
      send(res, 500, { error: String(error.message ?? error) });
    });
  }
  if (req.url.startsWith('/interaction/')) blankWebFonts(res);
  return handler(req, res);
});

server.listen(port, HOST, async () => {
  const bound = server.address().port;
  issuer = config.issuer ?? `http://${HOST}:${bound}`;
  try {
    const provider = buildProvider(issuer);
    for (const client of clients.values()) await provider.Client.validate(client);
    handler = provider.callback();
  } catch (error) {
    console.error('invalid configuration:', error.message, error.error_description ?? '');
    process.exit(1);
  }
  process.stdout.write(`${JSON.stringify({ issuer, port: bound })}\n`);
});

function shutdown() {
  server.close(() => process.exit(0));
  server.closeAllConnections();
}
process.on('SIGTERM', shutdown);
process.on('SIGINT', shutdown);
