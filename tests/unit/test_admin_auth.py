import pytest

from morphogen.publication.admin_auth import AdminAccess, AdminGuard, AdminTokenError

TOKEN = "s3cret-admin-token-0123456789"


def test_no_token_configured_disables_admin():
    g = AdminGuard.from_sources(None, None)
    assert not g.enabled
    assert g.check(f"Bearer {TOKEN}") is AdminAccess.DISABLED


def test_token_from_file_and_env(tmp_path, monkeypatch):
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    monkeypatch.setenv("MORPHOGEN_TEST_TOKEN", TOKEN)
    for g in (
        AdminGuard.from_sources(str(f), None),
        AdminGuard.from_sources(None, "MORPHOGEN_TEST_TOKEN"),
    ):
        assert g.check(f"Bearer {TOKEN}") is AdminAccess.GRANTED
        assert g.check(f"bearer {TOKEN}") is AdminAccess.GRANTED
        assert g.check(f"Bearer {TOKEN}x") is AdminAccess.DENIED
        assert g.check(f"Basic {TOKEN}") is AdminAccess.DENIED
        assert g.check(None) is AdminAccess.DENIED
        assert g.check("") is AdminAccess.DENIED
        assert TOKEN not in repr(g) and TOKEN not in str(g)
    monkeypatch.delenv("MORPHOGEN_TEST_TOKEN")
    assert not AdminGuard.from_sources(None, "MORPHOGEN_TEST_TOKEN").enabled


def test_bad_token_sources(tmp_path):
    with pytest.raises(AdminTokenError):
        AdminGuard.from_sources(str(tmp_path / "missing"), None)
    empty = tmp_path / "empty"
    empty.write_text("  \n")
    with pytest.raises(AdminTokenError):
        AdminGuard.from_sources(str(empty), None)
    short = tmp_path / "short"
    short.write_text("abc")
    with pytest.raises(AdminTokenError) as e:
        AdminGuard.from_sources(str(short), None)
    assert "abc" not in str(e.value)


def test_a_router_guard_never_fails_and_says_where_it_looked(tmp_path, monkeypatch) -> None:
    from morphogen.publication.admin_auth import WatchedAdminGuard

    missing = WatchedAdminGuard(str(tmp_path / "secret" / "token"), None)
    assert not missing.enabled
    assert missing.check("Bearer whatever-token-1234") is AdminAccess.DISABLED
    assert "cannot read the admin token file" in missing.problem
    assert str(tmp_path / "secret" / "token") in missing.problem
    monkeypatch.delenv("MORPHOGEN_TEST_UNSET", raising=False)
    unset = WatchedAdminGuard(None, "MORPHOGEN_TEST_UNSET")
    assert unset.problem == "no admin token in the variable MORPHOGEN_TEST_UNSET on this node"
    assert WatchedAdminGuard(None, None).problem is None  # admin off by configuration


def test_a_router_guard_follows_a_rotated_secret_file(tmp_path) -> None:
    from morphogen.publication.admin_auth import WatchedAdminGuard

    path = tmp_path / "token"
    guard = WatchedAdminGuard(str(path), None)  # mounted later
    assert guard.check("Bearer first-token-0123456789") is AdminAccess.DISABLED
    path.write_text("first-token-0123456789\n")
    assert guard.check("Bearer first-token-0123456789") is AdminAccess.GRANTED
    tmp = tmp_path / "new"
    tmp.write_text("second-token-0123456789")
    tmp.replace(path)  # how a Kubernetes secret volume swaps its files
    assert guard.check("Bearer first-token-0123456789") is AdminAccess.DENIED
    assert guard.check("Bearer second-token-0123456789") is AdminAccess.GRANTED
    assert "second-token" not in repr(guard.__dict__)
