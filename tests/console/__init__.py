"""``console``: the dashboard's pages, their permissions, partials and refusals, logins and
the client's address."""
