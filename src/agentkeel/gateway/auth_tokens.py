"""``auth.mode: jwt``: ``Authorization: Bearer <JWT>`` verified with PyJWT; the caller is ``sub``.

Either a shared secret (``auth.jwt.secret_env``, HS256/384/512, at least 32 bytes as RFC 7518
asks of an HS256 key) or the identity provider's public keys (``auth.jwt.jwks_url``). Every token
must carry ``exp`` and ``sub``; ``exp``/``nbf``/``iat`` allow ``LEEWAY_S`` of clock skew; ``iss``
and ``aud`` are checked when ``issuer``/``audience`` are set (a token naming an audience is refused
when none is configured, as PyJWT does). Permissions come from a ``permissions`` list claim, or
else the space-separated ``scope`` claim.

The JWKS is fetched in a worker thread (PyJWT's client is blocking), one fetch at a time, kept for
``JWKS_LIFESPAN_S``; an unknown ``kid`` (a rotated key) refetches it, at most once per
``JWKS_COOLDOWN_S``, so a stream of made-up ``kid`` values cannot turn into a stream of fetches.
When the JWKS cannot be fetched the keys already known go on verifying; with none known, the
request is a 503 (the server cannot check anything yet), not a 401 (the token may be fine).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

import jwt
from starlette.types import Scope

from agentkeel.config import JwtConfig
from agentkeel.gateway.auth import BEARER_CHALLENGE, AuthFailure, AuthSetupError, Identity, bearer_token

log = logging.getLogger(__name__)

LEEWAY_S = 30.0
MIN_SECRET_BYTES = 32
JWKS_LIFESPAN_S = 300.0
JWKS_COOLDOWN_S = 30.0
JWKS_TIMEOUT_S = 5.0
INVALID_TOKEN = f'{BEARER_CHALLENGE}, error="invalid_token"'


class JwksKeys:
    """The signing keys published at a JWKS URL, fetched off the event loop (module docstring)."""

    def __init__(self, url: str, *, lifespan_s: float = JWKS_LIFESPAN_S, cooldown_s: float = JWKS_COOLDOWN_S) -> None:
        self.url = url
        self._client = jwt.PyJWKClient(url, cache_jwk_set=False, timeout=JWKS_TIMEOUT_S)
        self._lifespan_s = lifespan_s
        self._cooldown_s = cooldown_s
        self._keys: dict[str | None, jwt.PyJWK] = {}
        self._fetched_at: float | None = None  # the last successful fetch
        self._tried_at: float | None = None  # the last attempt, successful or not
        self._lock = asyncio.Lock()
        self.fetches = 0  # attempts, for tests and logs

    def _fresh(self) -> bool:
        return self._fetched_at is not None and time.monotonic() - self._fetched_at < self._lifespan_s

    def _match(self, kid: str | None) -> jwt.PyJWK | None:
        if kid is None:  # a token without kid is fine while the set holds one key only
            return next(iter(self._keys.values())) if len(self._keys) == 1 else None
        return self._keys.get(kid)

    async def key(self, kid: str | None) -> jwt.PyJWK:
        found = self._match(kid)
        if found is not None and self._fresh():
            return found
        async with self._lock:
            found = self._match(kid)
            may_try = self._tried_at is None or time.monotonic() - self._tried_at >= self._cooldown_s
            if (found is None or not self._fresh()) and may_try:
                await self._refresh()
                found = self._match(kid)
        if found is not None:
            return found
        if not self._keys:
            raise AuthFailure(f"cannot verify tokens: the JWKS at {self.url} could not be fetched", 503, {"Retry-After": "5"})
        raise AuthFailure(f"invalid token: no key with kid {kid!r} in the JWKS", headers={"WWW-Authenticate": INVALID_TOKEN})

    async def _refresh(self) -> None:
        self._tried_at = time.monotonic()
        self.fetches += 1
        try:
            data = await asyncio.to_thread(self._client.fetch_data)
            keys = jwt.PyJWKSet.from_dict(data).keys
        except (jwt.PyJWTError, ValueError, OSError) as exc:
            log.warning("auth.jwt.jwks_url: fetching %s failed (%s); %d key(s) known", self.url, exc, len(self._keys))
            return
        self._keys = {k.key_id: k for k in keys}
        self._fetched_at = time.monotonic()


class JwtTokens:
    """The authenticator of ``auth.mode: jwt``."""

    def __init__(self, settings: JwtConfig, environ: Mapping[str, str]) -> None:
        self.settings = settings
        self._secret: str | None = None
        self._jwks: JwksKeys | None = None
        if settings.secret_env is not None:
            secret = environ.get(settings.secret_env, "")
            if not secret:
                raise AuthSetupError(f"auth.jwt.secret_env: environment variable {settings.secret_env} is not set or empty")
            if len(secret.encode()) < MIN_SECRET_BYTES:
                raise AuthSetupError(f"auth.jwt.secret_env: the secret in {settings.secret_env} is shorter than {MIN_SECRET_BYTES} bytes")
            self._secret = secret
        else:
            assert settings.jwks_url is not None  # JwtConfig requires one of the two
            self._jwks = JwksKeys(settings.jwks_url)

    async def __call__(self, scope: Scope) -> Identity:
        token = bearer_token(scope)
        if token is None:
            raise AuthFailure("missing bearer token: send Authorization: Bearer <JWT>")
        try:
            kid = jwt.get_unverified_header(token).get("kid")
        except jwt.PyJWTError as exc:
            raise AuthFailure(f"invalid token: {exc}", headers={"WWW-Authenticate": INVALID_TOKEN}) from None
        key: Any = self._secret if self._jwks is None else (await self._jwks.key(kid)).key
        s = self.settings
        try:
            claims = jwt.decode(
                token, key, algorithms=s.algorithms, audience=s.audience, issuer=s.issuer, leeway=LEEWAY_S,
                options={"require": ["exp", "sub"]},
            )
        except jwt.PyJWTError as exc:
            raise AuthFailure(f"invalid token: {exc}", headers={"WWW-Authenticate": INVALID_TOKEN}) from None
        return Identity(str(claims["sub"]), str(claims.get("name") or claims["sub"]), _permissions(claims), claims)


def _permissions(claims: Mapping[str, Any]) -> tuple[str, ...]:
    listed = claims.get("permissions")
    if isinstance(listed, list):
        return tuple(str(p) for p in listed)
    scope = claims.get("scope")
    return tuple(scope.split()) if isinstance(scope, str) else ()
