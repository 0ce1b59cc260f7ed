SELECT '{outcome}', {nulls}, 0 FROM due WHERE waiting
UNION ALL
SELECT '{outcome}', {nulls}, 0 FROM unplaced WHERE waiting
