"""What an exported model file promises its readers, shared by ``export`` (which writes it) and
``service`` (which reads it): the typicality statistics and score. Depends on numpy only."""
