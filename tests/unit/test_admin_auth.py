import pytest

from morphogen.admin_auth import AdminAccess, AdminGuard, AdminTokenError

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
