"""An example ocs-hil plugin (see pyproject.toml): `steps` adds the `cross_connect_census` step type, `ocs` the
`example-tl1-single` switch protocol."""
